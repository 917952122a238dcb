"""Peak CPU memory of full vs chunked selected-token log-probs (Chapter 3, Section 3.7).

The child can also run Chapter 14's checkpointed_log_probs (--child checkpointed, Section 14.3);
scripts/bench_scaling.py uses that to compare the three paths with gradients.

Each path runs in a fresh Python process: it warms up on a tiny input, resets the kernel's
peak-RSS counter (/proc/self/clear_refs, Linux), scores B x T tokens once, and reports how far
its peak resident memory rose above the level before the call. glibc's mmap threshold is fixed
so that freed tensors return to the OS at once and RSS follows the live tensors.

Usage: python scripts/bench_chunked_memory.py [--B 1 --T 2048 --D 128 --V 32768 --chunk 128 --grad]
Prints one JSON line: {"full_mb": ..., "chunked_mb": ..., "ratio": ...}  (MiB = 2**20 bytes).
Numbers vary a little between runs and machines; the ratio is the stable part.
"""
import argparse
import json
import os
import resource
import subprocess
import sys


def _kib(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f'{key} not found in /proc/self/status')


def child(path, B, T, D, V, chunk, grad):
    """Run one path in this (fresh) process and print its peak RSS growth in MiB."""
    import torch
    torch.set_num_threads(1)
    from agentrl.policies import chunked_log_probs, selected_log_probs
    from agentrl.scaling import checkpointed_log_probs
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, D, generator=g).requires_grad_(grad)
    weight = (torch.randn(V, D, generator=g) / D ** 0.5).requires_grad_(grad)
    ids = torch.randint(0, V, (B, T), generator=g)

    def run(h, i):
        with torch.set_grad_enabled(grad):
            if path == 'full':
                out = selected_log_probs(h @ weight.T, i)               # builds [B, T, V]
            elif path == 'checkpointed':                                 # recomputes each chunk in backward
                out = checkpointed_log_probs(h, weight, i, chunk_size=chunk)
            else:
                out = chunked_log_probs(h, weight, i, chunk_size=chunk)  # [B, chunk, V] at a time
            if grad:
                out.sum().backward()

    run(hidden[:, :8].detach().requires_grad_(grad), ids[:, :8])        # warm-up: one-time allocations
    weight.grad = None
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')                                                 # reset VmHWM
        before, use_hwm = _kib('VmRSS'), True
    except OSError:                                                      # fallback: lifetime peak growth
        before, use_hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, False
    run(hidden, ids)
    peak = _kib('VmHWM') if use_hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({'peak_mb': (peak - before) / 1024}))


def measure(path, args):
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', MALLOC_MMAP_THRESHOLD_='131072')
    cmd = [sys.executable, os.path.abspath(__file__), '--child', path, '--B', str(args.B), '--T', str(args.T),
           '--D', str(args.D), '--V', str(args.V), '--chunk', str(args.chunk)] + (['--grad'] if args.grad else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])['peak_mb']


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--B', type=int, default=1)
    ap.add_argument('--T', type=int, default=2048)
    ap.add_argument('--D', type=int, default=128)
    ap.add_argument('--V', type=int, default=32768)
    ap.add_argument('--chunk', type=int, default=128)
    ap.add_argument('--grad', action='store_true', help='measure forward + backward instead of scoring')
    ap.add_argument('--child', choices=['full', 'chunked', 'checkpointed'], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.B, args.T, args.D, args.V, args.chunk, args.grad)
        return
    full_mb, chunked_mb = measure('full', args), measure('chunked', args)
    print(json.dumps({'full_mb': round(full_mb, 1), 'chunked_mb': round(chunked_mb, 1),
                      'ratio': round(full_mb / chunked_mb, 2)}))


if __name__ == '__main__':
    main()
