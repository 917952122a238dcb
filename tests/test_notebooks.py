"""Output regression: every notebook re-executed must print what its committed copy printed."""
import copy
import json

import pytest

from nbcompare import compare_notebooks, lines_match
from notebook_runner import NOTEBOOKS, cpu_capability, execute, switched_kernels

# Longest first, so that two workers finish together.
ORDER = sorted(NOTEBOOKS, key=lambda p: (not p.name.startswith(('09', '10', '05', '08', '06', '03')), p.name))


@pytest.mark.timeout(3700)
@pytest.mark.parametrize('path', ORDER, ids=[p.stem for p in ORDER])
def test_notebook_outputs_match(path):
    expected = json.loads(path.read_text())
    got = execute(path)
    problems = compare_notebooks(expected, got, name=path.name)
    assert not problems, 'outputs differ from the committed notebook:\n' + '\n'.join(problems)


@pytest.mark.kernels
@pytest.mark.timeout(3700)
@pytest.mark.parametrize('path', ORDER, ids=[p.stem for p in ORDER])
def test_notebook_outputs_match_with_switched_kernels(path):
    """The same regression with torch and MKL on another instruction set: what a reader's CPU does."""
    env = switched_kernels()
    assert cpu_capability(env) != cpu_capability(), 'the kernel switch did not take effect'
    expected = json.loads(path.read_text())
    got = execute(path, env_extra=env)
    problems = compare_notebooks(expected, got, name=f"{path.name} ({env['ATEN_CPU_CAPABILITY']} kernels)")
    assert not problems, 'outputs differ from the committed notebook:\n' + '\n'.join(problems)


def test_every_notebook_has_outputs():
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())['cells']
        code = [c for c in cells if c['cell_type'] == 'code' and c['source']]
        assert any(c.get('outputs') for c in code), f'{path.name} has no stored outputs'


def _toy_notebook(text):
    return {'cells': [{'cell_type': 'code', 'id': 'abc', 'metadata': {}, 'source': 'print(x)',
                       'outputs': [{'output_type': 'stream', 'name': 'stdout', 'text': text}]}]}


def test_changed_stored_number_fails_comparison():
    """A committed number that no longer matches what the code prints is reported."""
    real = json.loads(NOTEBOOKS[0].read_text())
    edited = copy.deepcopy(real)
    for cell in edited['cells']:
        for out in cell.get('outputs', []):
            if out.get('output_type') == 'stream' and any(ch.isdigit() for ch in ''.join(out['text'])):
                text = ''.join(out['text'])
                i = next(k for k, ch in enumerate(text) if ch.isdigit())
                out['text'] = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]
                break
        else:
            continue
        break
    else:
        pytest.skip('no printed digit to change')
    assert compare_notebooks(real, real) == []
    problems = compare_notebooks(edited, real, name=NOTEBOOKS[0].name)
    assert len(problems) == 1 and 'first differing line' in problems[0]


def test_comparison_rules():
    a = _toy_notebook('J = 0.69590000 at 0x7f3a2b1c9d40\n<Figure size 640x480 with 1 Axes>\n')
    b = _toy_notebook('J = 0.69590001 at 0x7f00deadbeef\n')
    assert compare_notebooks(a, b) == []                       # tolerance, address, figure repr
    c = _toy_notebook('J = 0.6960\n')
    d = _toy_notebook('J = 0.6959\n')
    msg = compare_notebooks(c, d, name='toy.ipynb')
    assert msg and 'toy.ipynb' in msg[0] and 'abc' in msg[0]
    assert 'expected: J = 0.6960' in msg[0] and 'got:      J = 0.6959' in msg[0]
    assert not lines_match('pass rate 0.5', 'fail rate 0.5')   # words must be equal
    skip = _toy_notebook('t = 1.23 s\n')
    skip['cells'][0]['metadata']['tags'] = ['skip-compare']
    assert compare_notebooks(skip, _toy_notebook('t = 9.99 s\n')) == []
    img = _toy_notebook('x\n')
    img['cells'][0]['outputs'].append({'output_type': 'display_data',
                                       'data': {'image/png': 'AAAA', 'text/plain': 'fig'}})
    assert 'image' in compare_notebooks(img, _toy_notebook('x\n'))[0]
    bar = _toy_notebook('x\n')                                  # tqdm drawn as a Jupyter widget: ignored
    bar['cells'][0]['outputs'].insert(0, {'output_type': 'display_data', 'data': {
        'application/vnd.jupyter.widget-view+json': {'model_id': 'abc'}, 'text/plain': 'train_rl: 40%'}})
    assert compare_notebooks(bar, _toy_notebook('x\n')) == []


def test_committed_notebooks_are_finished():
    """Hidden cells carry `remove-cell`, figure-only cells `hide-input`; no stderr or progress widget is stored."""
    import sys
    sys.path.insert(0, str(NOTEBOOKS[0].parents[1] / 'scripts'))
    from tag_hidden import figure_only, is_progress, needs_tag
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())['cells']:
            if needs_tag(cell):
                assert 'remove-cell' in cell['metadata'].get('tags', []), f'{path.name}: {cell["id"]} not hidden'
            if figure_only(cell):
                assert 'hide-input' in cell['metadata'].get('tags', []), f'{path.name}: {cell["id"]} shows its drawing code'
            for out in cell.get('outputs', []):
                assert not is_progress(out), f'{path.name}: cell {cell["id"]} stores stderr or a progress widget'
