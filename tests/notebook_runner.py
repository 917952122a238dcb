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


def execute(path, timeout=900, env_extra=None, total=3600):
    """Run notebook `path` -> executed notebook as a dict. The committed file is never touched.

    timeout: seconds allowed per cell; total: seconds for the whole notebook (on a cold weights
    cache Chapter 9 trains two base agents and six GRPO runs, about 20 minutes on a loaded CPU).
    env_extra: environment variables added for this run (e.g. switched CPU kernels)."""
    path = pathlib.Path(path)
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONHASHSEED='0',
               MPLBACKEND='module://matplotlib_inline.backend_inline', **(env_extra or {}))
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / path.name
        out = pathlib.Path(tmp) / ('out_' + path.name)
        shutil.copy(path, src)
        cmd = [sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(NBS),
               '--no-progress-bar', '--execution-timeout', str(timeout), str(src), str(out)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=total)
        if run.returncode != 0:
            tail = run.stderr[-4000:]
            raise AssertionError(f'{path.name} failed to execute:\n{tail}')
        return json.loads(out.read_text())


def cpu_capability(env_extra=None):
    "The instruction set torch's CPU kernels use in a fresh process with env_extra set: 'AVX512', 'AVX2', ..."
    env = dict(os.environ, **(env_extra or {}))
    code = 'import torch; print(torch.backends.cpu.get_cpu_capability())'
    return subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def switched_kernels():
    """Environment that moves torch (ATen) and MKL to another instruction set than this CPU's default.

    AVX512 machines drop to AVX2; every other machine drops to the portable baseline ('default'
    in ATen, SSE4.2 in MKL). The weights cache is the normal one: scripts/warm_cache.py (run first
    by `make test`) trains half of the missing cached runs under these kernels, so a regression
    that reproduces the stored outputs from them also proves that training is portable."""
    env = {}
    if cpu_capability() == 'AVX512':
        env.update(ATEN_CPU_CAPABILITY='avx2', MKL_ENABLE_INSTRUCTIONS='AVX2')
    else:
        env.update(ATEN_CPU_CAPABILITY='default', MKL_ENABLE_INSTRUCTIONS='SSE4_2')
    return env
