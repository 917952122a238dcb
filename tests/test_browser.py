"""The rendered book as a reader sees it, in a real browser: nothing cut off, nothing broken.

Builds the site (from the stored outputs), serves it on localhost and opens every chapter page, the
front page and the library page in headless Chromium (Debian's package, driven by Playwright; no
browser is downloaded) at a 1280 px laptop width and a 390 px phone width. A page fails when a code
cell (at 1280 px), an output, a display equation, a table or a figure is wider than its column, when
the page itself scrolls sideways, when an image does not load, or when raw TeX is left visible.
On a phone, code cells may scroll sideways inside their own box; nothing else may.
"""
import functools
import http.server
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = (ROOT / 'tests' / 'site_probe.js').read_text()
WIDTHS = (1280, 390)
MATH_DONE = "() => [...document.querySelectorAll('.math')].every(e => e.querySelector('mjx-container'))"


def chromium_path():
    import os
    if os.environ.get('CHROMIUM'):
        return os.environ['CHROMIUM']
    for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail('no Chromium on this machine: install Debian\'s package (apt-get install chromium), or '
                'point CHROMIUM at a Chromium or Chrome binary; .ci/run installs it before `make test`')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    """The built site served on a free localhost port -> (base URL, page paths)."""
    out = tmp_path_factory.mktemp('site')
    jb = pathlib.Path(sys.executable).parent / 'jupyter-book'
    run = subprocess.run([str(jb), 'build', str(ROOT), '--path-output', str(out), '-q'],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    html = out / '_build' / 'html'
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(html))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pages = [f'nbs/{p.stem}.html' for p in sorted((ROOT / 'nbs').glob('*.ipynb'))] + ['intro.html', 'library.html']
    yield f'http://127.0.0.1:{server.server_address[1]}', pages
    server.shutdown()


@pytest.fixture(scope='module')
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(),
                              args=['--no-sandbox', '--disable-gpu', '--disable-background-networking',
                                    '--disable-component-update', '--no-first-run'])
        yield b
        b.close()


def load(browser, url, width):
    page = browser.new_page(viewport={'width': width, 'height': 900})
    failed = []
    page.on('requestfailed', lambda r: failed.append(r.url))
    page.goto(url, wait_until='load')
    page.wait_for_function(MATH_DONE, timeout=60_000)
    page.wait_for_timeout(200)
    return page, failed


@pytest.mark.timeout(600)
@pytest.mark.parametrize('width', WIDTHS)
def test_every_page_fits_its_column(site, browser, width):
    base, pages = site
    problems = []
    for path in pages:
        page, failed = load(browser, f'{base}/{path}', width)
        found = page.evaluate(PROBE)
        page.close()
        if width > 600 and found['code']:
            problems.append(f"{path}: code cells wider than the column: {found['code'][:5]}")
        for key, what in (('outputs', 'outputs wider than the column'), ('math', 'display equations wider'),
                          ('images', 'figures broken or too wide'), ('tex', 'raw TeX visible'),
                          ('page', 'the page scrolls sideways')):
            if found[key]:
                problems.append(f'{path}: {what}: {found[key][:5]}')
        local = [u for u in failed if u.startswith(base)]
        if local:
            problems.append(f'{path}: failed to load: {local[:5]}')
    assert not problems, f'at {width} px:\n' + '\n'.join(problems)


def test_library_page_shows_every_summary_whole(site, browser):
    """Summaries that quote '<call>' or '<nl>' must show them, not lose them as HTML tags."""
    import importlib
    sys.path.insert(0, str(ROOT / 'scripts'))
    import library_page
    base, _ = site
    page, _ = load(browser, f'{base}/library.html', 1280)
    rows = page.evaluate("() => [...document.querySelectorAll('article table tbody tr')].map("
                         "tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))")
    page.close()
    shown = {r[0]: r[1] for r in rows if len(r) >= 2}
    missing = []
    modules = [importlib.import_module(f'agentrl.{m}') for m, _, _ in library_page.chapters()]
    for name, obj in ((n, getattr(m, n)) for m in modules for n in m.__all__):
        if not callable(obj):
            continue
        want = ' '.join(library_page.first_line(obj).replace('`', '').split())   # backticks render as code
        got = next((' '.join(v.split()) for k, v in shown.items() if re.match(rf'(class )?{name}\(', k)), None)
        if got != want:
            missing.append(f'{name}: shows {got!r}, docstring says {want!r}')
    assert not missing, '\n'.join(missing[:10])
