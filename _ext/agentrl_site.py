"""Sphinx extension for the Agent RL site: what a reader sees of the notebooks.

* nbdev's directive lines (`#| export`, `#| hide`, ...) are build instructions, not code the reader
  needs: they are removed from the displayed cell inputs (the notebooks keep them).
* Each figure a cell draws gets its caption as alt text: the text of the next paragraph that starts
  with "Figure N.k", which is how every chapter captions its figures.
"""
import re

from docutils import nodes

DIRECTIVE = re.compile(r'^#\|.*\n?', re.M)
CAPTION = re.compile(r'^Figure [0-9A-Z]+\.\d+')


def _has_class(node, name):
    return isinstance(node, nodes.Element) and name in node.get('classes', [])


def _in_cell(node, part):
    "True if node sits inside a notebook cell container of class `part` ('cell_input' or 'cell_output')."
    parent = node.parent
    while parent is not None:
        if _has_class(parent, part):
            return True
        parent = parent.parent
    return False


def strip_directives(doctree):
    for block in list(doctree.findall(nodes.literal_block)):
        if not _in_cell(block, 'cell_input'):
            continue
        text = block.astext()
        cleaned = DIRECTIVE.sub('', text)
        if cleaned != text:
            block.rawsource = cleaned
            block.children = [nodes.Text(cleaned)]


def caption_alt_text(doctree):
    pending = []                                  # figures waiting for their caption
    for node in doctree.findall():
        if isinstance(node, nodes.image) and _in_cell(node, 'cell_output'):
            pending.append(node)
        elif isinstance(node, nodes.paragraph) and pending:
            text = ' '.join(node.astext().split())
            if CAPTION.match(text):
                alt = text if len(text) <= 400 else text[:397] + '...'
                for image in pending:
                    image['alt'] = alt
                pending = []


def on_doctree_read(app, doctree):
    strip_directives(doctree)
    caption_alt_text(doctree)


def setup(app):
    app.connect('doctree-read', on_doctree_read)
    return {'version': '1.0', 'parallel_read_safe': True, 'parallel_write_safe': True}
