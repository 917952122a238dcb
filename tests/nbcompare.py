"""Compare the printed outputs of two executions of a notebook.

Used by the output-regression tests: the committed notebook holds the expected outputs, a fresh
papermill run gives the actual ones. Code cells are matched by cell id. For each cell we compare
stdout and the `text/plain` of results, after removing noise that carries no meaning:

* execution counts and metadata (never looked at),
* stderr (progress bars, paths of temporary files) and progress-bar widgets,
* `<Figure size ...>` reprs and memory addresses (`0x7f...`),
* trailing whitespace.

Numbers are compared at a relative tolerance (float32 digits can move in the last place across
machines); all other text must be equal. The number of images per cell must be equal.
Cells tagged `skip-compare` are executed but not compared.
"""
import math
import re

NUMBER = re.compile(r'[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?\b(?:nan|inf)\b')
ADDRESS = re.compile(r'0x[0-9a-fA-F]{6,}')
FIGURE = re.compile(r'<Figure size [^>]*>')
IMAGE_TYPES = ('image/png', 'image/jpeg', 'image/svg+xml')
WIDGET = 'application/vnd.jupyter.widget-view+json'


def _text(value):
    return ''.join(value) if isinstance(value, list) else (value or '')


def cell_view(cell):
    """Comparable view of one code cell -> (text lines, image count)."""
    lines, images = [], 0
    for out in cell.get('outputs', []):
        kind = out.get('output_type')
        if kind == 'stream':
            if out.get('name') == 'stdout':
                lines.append(_text(out.get('text')))
        elif kind in ('execute_result', 'display_data'):
            data = out.get('data', {})
            if WIDGET in data:             # a tqdm progress bar drawn as a Jupyter widget
                continue
            images += sum(t in data for t in IMAGE_TYPES)
            if 'text/plain' in data and not any(t in data for t in IMAGE_TYPES):
                lines.append(_text(data['text/plain']) + '\n')
        elif kind == 'error':
            lines.append(f"ERROR {out.get('ename')}: {out.get('evalue')}\n")
    text = ''.join(lines)
    text = FIGURE.sub('', ADDRESS.sub('0xADDR', text))
    clean = [ln.rstrip() for ln in text.splitlines()]
    return [ln for ln in clean if ln], images


def lines_match(expected, got, rtol=1e-6, atol=1e-12):
    """True when two lines have the same words and numbers equal within tolerance."""
    if expected == got:
        return True
    if NUMBER.sub('#', expected) != NUMBER.sub('#', got):
        return False
    for a, b in zip(NUMBER.findall(expected), NUMBER.findall(got)):
        x, y = float(a), float(b)
        if math.isnan(x) and math.isnan(y):
            continue
        if x == y:
            continue
        if not math.isclose(x, y, rel_tol=rtol, abs_tol=atol):
            return False
    return True


def compare_notebooks(expected_nb, got_nb, name='notebook', rtol=1e-6):
    """List of human-readable mismatches between two notebooks (dicts); empty when they agree."""
    got_cells = {c.get('id'): c for c in got_nb['cells'] if c.get('cell_type') == 'code'}
    problems = []
    for cell in expected_nb['cells']:
        if cell.get('cell_type') != 'code':
            continue
        cid = cell.get('id')
        if 'skip-compare' in cell.get('metadata', {}).get('tags', []):
            continue
        if cid not in got_cells:
            problems.append(f'{name}: cell {cid}: missing from the executed notebook')
            continue
        (want, want_img), (have, have_img) = cell_view(cell), cell_view(got_cells[cid])
        if want_img != have_img:
            problems.append(f'{name}: cell {cid}: {want_img} image(s) expected, got {have_img}')
        for i in range(max(len(want), len(have))):
            a = want[i] if i < len(want) else '<no line>'
            b = have[i] if i < len(have) else '<no line>'
            if not lines_match(a, b, rtol=rtol):
                problems.append(f'{name}: cell {cid}: first differing line {i + 1}\n'
                                f'  expected: {a}\n  got:      {b}')
                break
    return problems
