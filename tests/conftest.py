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
