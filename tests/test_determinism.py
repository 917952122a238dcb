"""One notebook executed twice in fresh kernels prints identical outputs and identical figures."""

import pytest

from nbcompare import cell_view
from notebook_runner import NBS, execute

# The fundamentals chapter mixes seeded sampling, float64 solves and autograd; quick to run.
NOTEBOOK = NBS / '02_rl_fundamentals.ipynb'


@pytest.mark.timeout(900)
def test_same_outputs_twice():
    if not NOTEBOOK.exists():
        pytest.skip('chapter 2 not present')
    first, second = execute(NOTEBOOK), execute(NOTEBOOK)
    for a, b in zip(first['cells'], second['cells']):
        if a['cell_type'] != 'code':
            continue
        assert cell_view(a) == cell_view(b), f"cell {a['id']} printed different text"
        pngs_a = [o['data']['image/png'] for o in a['outputs'] if 'image/png' in o.get('data', {})]
        pngs_b = [o['data']['image/png'] for o in b['outputs'] if 'image/png' in o.get('data', {})]
        assert pngs_a == pngs_b, f"cell {a['id']} drew a different figure"
