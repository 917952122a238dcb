"""Probe: cost of one cached decode step's attention per episode, against the bytes it reads (Chapter 5).

One call of torch's scaled_dot_product_attention as TinyAgent makes it in a decode step (one
query per row, no key mask, H = 4 heads of 16 dimensions, keys and values a [:, :, :S] view of a larger cache
buffer) for batch sizes 1, 8 and 32, cache lengths S = 60 and 125, in float64 and float32. Reports
microseconds per call and per row (best of --best runs of --calls calls, wall clock, one thread),
the megabytes of keys and values the call reads and the bandwidth that implies, and, for
reference, the bandwidth of summing a 64 MB float64 tensor (a streaming read from memory).
Once the keys and values of a batch outgrow the core's private L2 cache, the cost per row rises
with B (the numbers come from the shared cache or from memory), and float32 (half the bytes) gains
most at large B. Then profiles one rollout_batch of the 32 episodes of Chapter 5's Section 5.6 (the
untrained agent, seed 0) in float64 and float32 with torch.profiler and sums the operators' own CPU
time by kind (attention, matrix products, GELU, data movement, everything else) in the run with
the median total of 3: where the batch's time goes, and which parts float32 makes cheaper. Last, one
whole cached decode forward of that agent (TinyAgent.hidden on one new token per row after S cached
tokens, no key mask) at B = 1 and B = 32, S = 60 and 125, in both dtypes: the per-row ratio
32 * t(B = 1) / t(B = 32) bounds what batching can gain on the decode steps of rollout_batch over
one episode at a time (sampling and the environments come on top). The last stdout line is one
JSON object.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

KINDS = {'attention': ('aten::_scaled_dot_product_flash_attention_for_cpu',),
         'matmul': ('aten::addmm', 'aten::mm', 'aten::bmm'),
         'gelu': ('aten::gelu',),
         'data_movement': ('aten::copy_', 'aten::gather', 'aten::index', 'aten::index_select', 'aten::cat')}


def best_us(fn, calls, best_of):
    "Best of best_of timings of `calls` calls of fn() -> microseconds per call."
    fn()
    best = float('inf')
    for _ in range(best_of):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def rollout_profile(dtype, runs=3):
    "Operator self time (ms) by kind of one rollout_batch of Section 5.6's 32 episodes: the run with the median total."
    from agentrl.gym import BugFixEnv, make_tasks
    from agentrl.policies import TinyAgent
    from agentrl.trajectories import build_tokenizer, rollout_batch
    tasks = [t for t in make_tasks('all') if t.split != 'test']      # as Chapter 5 does
    tok = build_tokenizer(tasks)
    group = [t for t in tasks[::10] for _ in range(4)]
    torch.manual_seed(0)
    model = TinyAgent(vocab_size=len(tok), dtype=dtype)
    run = lambda: rollout_batch(model, [BugFixEnv() for _ in group], group, tok,
                                generator=torch.Generator().manual_seed(0))
    run()
    per_run = []
    for _ in range(runs):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        ms = dict.fromkeys([*KINDS, 'other'], 0.0)
        for event in prof.key_averages():
            ms[next((k for k, names in KINDS.items() if event.key in names), 'other')] += event.self_cpu_time_total / 1e3
        per_run.append({k: round(v, 1) for k, v in ms.items()})
    median = sorted(per_run, key=lambda ms: sum(ms.values()))[len(per_run) // 2]   # one whole run
    return {**median, 'total': round(sum(median.values()), 1)}


def decode_forward_us(dtype, B, S, calls, best_of):
    "Microseconds of one cached decode forward (TinyAgent.hidden, one token per row after S cached tokens)."
    from agentrl.policies import TinyAgent
    torch.manual_seed(0)
    model = TinyAgent(vocab_size=318, dtype=dtype)      # the size of Chapter 5's tokenizer
    cache = model.new_cache()
    with torch.no_grad():
        model.hidden(torch.randint(0, 318, (B, S), generator=torch.Generator().manual_seed(0)), kv_cache=cache)
    next_pos, new = cache.next_pos, torch.zeros(B, 1, dtype=torch.long)

    def step():                              # decode one token, then forget it: every call sees S cached keys
        with torch.no_grad():
            model.hidden(new, kv_cache=cache)
        cache.length, cache.next_pos = S, next_pos
    return best_us(step, calls, best_of)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--best', type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    H, Dh, capacity = 4, 16, 256
    rows = []
    for dtype in (torch.float64, torch.float32):
        for B in (1, 8, 32):
            for S in (60, 125):
                k_buf = torch.randn(B, H, capacity, Dh, generator=gen, dtype=dtype)
                v_buf = torch.randn(B, H, capacity, Dh, generator=gen, dtype=dtype)
                q = torch.randn(B, H, 1, Dh, generator=gen, dtype=dtype)
                k, v = k_buf[:, :, :S], v_buf[:, :, :S]
                us = best_us(lambda: F.scaled_dot_product_attention(q, k, v), args.calls, args.best)
                mb = 2 * k.numel() * k.element_size() / 1e6
                rows.append({'dtype': str(dtype).removeprefix('torch.'), 'B': B, 'S': S, 'kv_mb': round(mb, 3),
                             'us_per_call': round(us, 1), 'us_per_row': round(us / B, 2),
                             'gb_per_s': round(mb / us * 1e3, 1)})
                print(f"{dtype!s:14s} B={B:2d} S={S:3d}  K+V {mb:5.2f} MB  {us:6.1f} us/call  "
                      f"{us / B:5.2f} us/row  {mb / us * 1e3:5.1f} GB/s")
    big = torch.randn(8_000_000, generator=gen, dtype=torch.float64)        # 64 MB
    stream = 64e6 / best_us(lambda: big.sum(), 10, args.best) / 1e3
    print(f'streaming read (sum of 64 MB float64): {stream:.1f} GB/s')
    profiles = {str(dt).removeprefix('torch.'): rollout_profile(dt) for dt in (torch.float64, torch.float32)}
    for name, ms in profiles.items():
        print(f'rollout_batch, B = 32, {name}: operator time (ms) ' + '  '.join(f'{k} {v}' for k, v in ms.items()))
    forwards = []
    for dtype in (torch.float64, torch.float32):
        for S in (60, 125):
            one, batch = (decode_forward_us(dtype, B, S, args.calls, args.best) for B in (1, 32))
            forwards.append({'dtype': str(dtype).removeprefix('torch.'), 'S': S, 'us_B1': round(one, 1),
                             'us_B32': round(batch, 1), 'per_row_ratio': round(32 * one / batch, 2)})
            print(f"decode forward, {dtype!s:14s} S={S:3d}: B=1 {one:6.1f} us, B=32 {batch:7.1f} us, "
                  f"per row {32 * one / batch:5.2f}x cheaper batched")
    print(json.dumps({'clock': 'perf_counter, 1 thread', 'heads': H, 'head_dim': Dh, 'calls': rows,
                      'stream_gb_per_s': round(stream, 1), 'rollout_batch_profile_ms': profiles,
                      'decode_forward': forwards}))


if __name__ == '__main__':
    main()
