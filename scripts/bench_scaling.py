"""Peak CPU memory WITH gradients of the output layer's log-probs (Chapter 14, Section 14.3).

Forward and backward of selected-token log-probs at V = 32768, T = 2048, D = 128 (float32, B = 1),
each path in a fresh process as in scripts/bench_chunked_memory.py (whose child does the work):
the full [T, V] logits (selected_log_probs), Chapter 3's chunked_log_probs, and Chapter 14's
checkpointed_log_probs at several chunk sizes. Chunking alone stores every chunk's log-softmax for
the backward pass; the checkpointed version stores none and recomputes one chunk at a time.
Goal: checkpointed at chunk 128 needs <= 1/4 of the full path's peak.

It also times packing (Section 14.1) in float64 on one thread: the 64 episodes of one GRPO step
of make_rl_base(tok, 0) (cached), forward and backward of the token-mean surrogate, as one padded
batch, as length-sorted chunks of 8 rows and packed into rows of 256 tokens; median of 5
interleaved repeats, with the padding share of each layout.

Usage: python scripts/bench_scaling.py [--T 2048 --V 32768 --D 128]
Prints one JSON object (MiB = 2**20 bytes; ratios are full / path).
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_chunked_memory import measure   # noqa: E402

CHUNKS = (128, 512, 1024)


def packing_times(repeats=5):
    "Seconds of forward + backward for the padded, sorted-chunk and packed layouts of one GRPO step."
    import torch
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    from agentrl.gym import make_tasks
    from agentrl.trajectories import build_tokenizer, collate
    from agentrl.grpo import RLConfig, make_rl_base, sample_groups, compute_advantages
    from agentrl.policies import sequence_log_probs, selected_log_probs
    from agentrl.policy_gradient import aggregate_loss
    from agentrl.scaling import pack_sequences, packed_logits, unpack_sequences
    tok = build_tokenizer(make_tasks('all'))
    cfg = RLConfig()
    base = make_rl_base(tok, 0)
    trajs = sample_groups(base, None, make_tasks('train')[:8], tok, cfg, torch.Generator().manual_seed(14))
    batch = collate(trajs, tok.pad_id)
    adv = compute_advantages(batch, cfg)
    params = list(base.parameters())
    lengths = [len(t) for t in trajs]
    order = sorted(range(len(trajs)), key=lambda b: lengths[b])
    chunks = [order[i:i + 8] for i in range(0, len(trajs), 8)]
    packed = pack_sequences(trajs, 256, tok.pad_id)
    N = batch['action_mask'].sum()

    def padded():
        return aggregate_loss(-adv[:, None] * sequence_log_probs(base, batch['ids']), batch['action_mask'])

    def sorted_chunks():
        total = 0.0
        for c in chunks:
            L = max(lengths[b] for b in c)
            logp = sequence_log_probs(base, batch['ids'][c, :L])
            total = total + (-adv[c, None] * logp * batch['action_mask'][c, :L - 1]).sum() / N
        return total

    def packed_loss():
        logits = packed_logits(base, packed['ids'], packed['position_ids'], packed['segment_ids'])
        logp = unpack_sequences(selected_log_probs(logits[:, :-1], packed['ids'][:, 1:]), packed)
        return aggregate_loss(-adv[:, None] * logp, batch['action_mask'])

    layouts = {'padded': padded, 'sorted_chunks': sorted_chunks, 'packed_256': packed_loss}
    seconds = {name: [] for name in layouts}
    for _ in range(repeats):
        for name, fn in layouts.items():
            start = time.perf_counter()
            torch.autograd.grad(fn(), params)
            seconds[name].append(time.perf_counter() - start)
    real = sum(lengths)
    slots = {'padded': len(trajs) * max(lengths),
             'sorted_chunks': sum(len(c) * max(lengths[b] for b in c) for c in chunks),
             'packed_256': packed['ids'].numel()}
    report = {'episodes': len(trajs), 'tokens': real}
    for name in layouts:
        report[f'{name}_padding_share'] = round(1 - real / slots[name], 3)
        report[f'{name}_ms'] = round(1000 * statistics.median(seconds[name]), 1)
    report['speedup_packed_vs_padded'] = round(report['padded_ms'] / report['packed_256_ms'], 2)
    report['speedup_packed_vs_sorted_chunks'] = round(report['sorted_chunks_ms'] / report['packed_256_ms'], 2)
    return report


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
    report['packing'] = packing_times()
    print(json.dumps(report))


if __name__ == '__main__':
    main()
