"""Peak CPU memory WITH gradients of the output layer's log-probs (Chapter 14, Section 14.3).

Forward and backward of selected-token log-probs at V = 32768, T = 2048, D = 128 (float32, B = 1),
each path in a fresh process as in scripts/bench_chunked_memory.py (whose child does the work):
the full [T, V] logits (selected_log_probs), Chapter 3's chunked_log_probs, and Chapter 14's
checkpointed_log_probs at several chunk sizes. Chunking alone stores every chunk's log-softmax for
the backward pass; the checkpointed version stores none and recomputes one chunk at a time.
Goal: checkpointed at chunk 128 needs <= 1/4 of the full path's peak.

Usage: python scripts/bench_scaling.py [--T 2048 --V 32768 --D 128]
Prints one JSON object (MiB = 2**20 bytes; ratios are full / path).
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_chunked_memory import measure   # noqa: E402

CHUNKS = (128, 512, 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--B', type=int, default=1)
    ap.add_argument('--T', type=int, default=2048)
    ap.add_argument('--D', type=int, default=128)
    ap.add_argument('--V', type=int, default=32768)
    args = ap.parse_args()
    run = lambda path, chunk: measure(path, argparse.Namespace(B=args.B, T=args.T, D=args.D, V=args.V,
                                                               chunk=chunk, grad=True))
    full = run('full', CHUNKS[0])
    chunked = run('chunked', CHUNKS[0])
    ckpt = {c: run('checkpointed', c) for c in CHUNKS}
    report = {'grad': True, 'B': args.B, 'T': args.T, 'D': args.D, 'V': args.V, 'dtype': 'float32',
              'full_mb': round(full, 1), f'chunked_{CHUNKS[0]}_mb': round(chunked, 1),
              **{f'checkpointed_{c}_mb': round(v, 1) for c, v in ckpt.items()},
              f'ratio_chunked_{CHUNKS[0]}': round(full / chunked, 2),
              **{f'ratio_checkpointed_{c}': round(full / v, 2) for c, v in ckpt.items()}}
    report['goal_checkpointed_128_at_most_quarter'] = full / ckpt[128] >= 4.0
    print(json.dumps(report))


if __name__ == '__main__':
    main()
