"""The site builds with warnings as errors, chapter pages carry their figures, library page is current."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'scripts'))


def test_library_page_is_current():
    import library_page
    committed = (ROOT / 'library.md').read_text()
    assert committed.strip() == library_page.render().strip(), (
        'library.md is stale: run `make libpage` and commit it')


def test_toc_lists_every_notebook():
    toc = (ROOT / '_toc.yml').read_text()
    for nb in sorted((ROOT / 'nbs').glob('*.ipynb')):
        assert f'nbs/{nb.stem}' in toc, f'{nb.name} is not in _toc.yml'


@pytest.mark.timeout(900)
def test_site_builds_with_figures(tmp_path):
    mathjax = ROOT / '_mathjax' / 'mathjax' / 'tex-mml-chtml.js'
    assert mathjax.exists(), 'offline MathJax missing: run `make mathjax`'
    jb = pathlib.Path(sys.executable).parent / 'jupyter-book'
    run = subprocess.run([str(jb), 'build', str(ROOT), '--path-output', str(tmp_path),
                          '-W', '-n', '--keep-going', '-q'], capture_output=True, text=True)
    assert run.returncode == 0, f'jupyter-book build failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}'
    html = tmp_path / '_build' / 'html'
    assert (html / '_static' / 'mathjax' / 'tex-mml-chtml.js').exists()
    for nb in sorted((ROOT / 'nbs').glob('*.ipynb')):
        cells = json.loads(nb.read_text())['cells']
        n_figs = sum('image/png' in o.get('data', {}) for c in cells for o in c.get('outputs', []))
        page = (html / 'nbs' / f'{nb.stem}.html').read_text()
        assert len(re.findall(r'<img[^>]+\.png', page)) >= n_figs, f'{nb.stem}: figures missing'
        if 'class="math' in page:
            assert 'mathjax/tex-mml-chtml.js' in page, f'{nb.stem}: math without offline MathJax'
        assert '#| hide' not in page, f'{nb.stem}: a hidden cell is shown'
        shown_code = ' '.join(re.findall(r'<pre>(.*?)</pre>', page, re.S))
        assert '#| export' not in shown_code, f'{nb.stem}: nbdev directives shown in the code'
        for alt in re.findall(r'<img alt="([^"]*)"[^>]+\.png', page):
            assert alt.startswith('Figure '), f'{nb.stem}: a figure without its caption as alt text: {alt[:60]!r}'
    assert (html / 'library.html').exists()
