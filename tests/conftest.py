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
