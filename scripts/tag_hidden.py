"""Finish an executed notebook for committing.

* Every nbdev-hidden cell (`#| hide`, `#| default_exp`) gets the Jupyter Book tag `remove-cell`.
* Every cell that only draws a figure (an image output, no printed text) gets `hide-input`: the
  reader sees the figure, and the drawing code is one click away.
* stderr outputs (progress bars, warnings with temporary paths) and progress-bar widgets (tqdm's
  Jupyter display when ipywidgets is installed) are dropped: they are never compared nor rendered,
  and they change from run to run.

Usage: python scripts/tag_hidden.py nbs/02_rl_fundamentals.ipynb [...]   (no argument: every notebook)
Rewrites a notebook only when something changed.
"""
import json
import pathlib
import sys

HIDDEN = ('#| hide', '#| default_exp')


def needs_tag(cell):
    src = ''.join(cell.get('source', ''))
    first = src.lstrip().splitlines()[0] if src.strip() else ''
    return cell.get('cell_type') == 'code' and first.startswith(HIDDEN)


WIDGET = 'application/vnd.jupyter.widget-view+json'


def is_progress(output):
    "True for stderr and for a widget display (a tqdm bar): outputs a finished notebook does not keep."
    return ((output.get('output_type') == 'stream' and output.get('name') == 'stderr')
            or WIDGET in output.get('data', {}))


def figure_only(cell):
    "True for a code cell whose outputs are images and nothing printed (a cell that draws a figure)."
    outs = cell.get('outputs', []) if cell.get('cell_type') == 'code' else []
    images = any(any(k.startswith('image/') for k in o.get('data', {})) for o in outs)
    text = any(o.get('output_type') == 'stream' and o.get('name') == 'stdout' for o in outs)
    return images and not text


def tag_notebook(path):
    nb = json.loads(path.read_text())
    changed = False
    for cell in nb['cells']:
        tags = cell.setdefault('metadata', {}).setdefault('tags', [])
        if needs_tag(cell) and 'remove-cell' not in tags:
            tags.append('remove-cell')
            changed = True
        if figure_only(cell) and 'hide-input' not in tags:
            tags.append('hide-input')
            changed = True
        if not tags:
            del cell['metadata']['tags']
        outputs = cell.get('outputs', [])
        kept = [o for o in outputs if not is_progress(o)]
        if len(kept) != len(outputs):
            cell['outputs'] = kept
            changed = True
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return changed


if __name__ == '__main__':
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted(pathlib.Path('nbs').glob('*.ipynb'))
    for p in paths:
        if tag_notebook(p):
            print(f'finished {p}: hidden and figure cells tagged, stderr and progress widgets dropped')
