import inspect
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests'))
# One thread everywhere, as in the notebooks: reductions split across threads round differently.
os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('MKL_NUM_THREADS', '1')

import torch  # noqa: E402

# The book computes in float64 (Section 3.5), and so do the tests: a tensor made without a
# dtype is float64, as in every notebook. Tests of float32 or bfloat16 behaviour say so.
torch.set_default_dtype(torch.float64)


import pytest  # noqa: E402

from agentrl.gym import make_tasks  # noqa: E402
from agentrl.policies import TinyAgent  # noqa: E402
from agentrl.trajectories import build_tokenizer  # noqa: E402


@pytest.fixture(scope='module')
def tok():
    "The book's tokenizer over every gym task (Chapter 5); a module may define its own."
    return build_tokenizer(make_tasks('all'))


@pytest.fixture(scope='module')
def tiny(tok):
    "A small untrained policy (fast to sample and update), one per test module."
    torch.manual_seed(0)
    return TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)


def small_base(tok, seed=0):
    "Stand-in for make_rl_base in cache tests: a small seeded policy in eval mode."
    torch.manual_seed(seed)
    return TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2).eval()


def recompiled(fn, path, edit):
    """fn compiled again from edit(its source), among the names of its module, from a file written to path
    (where inspect.getsource, and so the cache keys' code hash, finds it) -> function."""
    text = edit(inspect.getsource(fn))
    path.write_text(text)
    namespace = dict(vars(sys.modules[fn.__module__]))
    exec(compile(text, str(path), 'exec'), namespace)
    return namespace[fn.__name__]


def reworded(src):
    "src of a function whose docstring is one line, with another docstring and a comment: other prose, same code."
    doc = src.splitlines()[1]
    assert doc.strip().startswith('"'), f'expected a one-line docstring, got {doc!r}'
    return src.replace(doc, '    "Another docstring."  # and a comment', 1)
