"""Execute a notebook with papermill in a fresh kernel, on a temporary copy, with one thread."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
NOTEBOOKS = sorted(NBS.glob('*.ipynb'))


def execute(path, timeout=900):
    """Run notebook `path` -> executed notebook as a dict. The committed file is never touched."""
    path = pathlib.Path(path)
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONHASHSEED='0',
               MPLBACKEND='module://matplotlib_inline.backend_inline')
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / path.name
        out = pathlib.Path(tmp) / ('out_' + path.name)
        shutil.copy(path, src)
        cmd = [sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(NBS),
               '--no-progress-bar', '--execution-timeout', str(timeout), str(src), str(out)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 120)
        if run.returncode != 0:
            tail = run.stderr[-4000:]
            raise AssertionError(f'{path.name} failed to execute:\n{tail}')
        return json.loads(out.read_text())
