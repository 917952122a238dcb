"""Probe: rollout throughput of Chapter 5 (agentrl.trajectories) on an untrained TinyAgent.

Measures trajectory tokens per CPU-second (time.process_time, one thread, best of --repeats runs)
for one-episode-at-a-time `rollout` and for lockstep `rollout_batch` at batch size --batch, plus
the lockstep engine without its KV cache. CPU time rather than wall time, so that other programs
on a shared machine do not distort the ratios. The last stdout line is one JSON object:
{"batch_tokens_per_s", "single_tokens_per_s", "speedup", "kv_cache_speedup", ...}.
"""
import argparse
import json
import time

import torch

from agentrl.gym import BugFixEnv, make_tasks
from agentrl.policies import TinyAgent
from agentrl.trajectories import _lockstep, build_tokenizer, rollout, rollout_batch


def tokens_per_second(run, repeats):
    best = 0.0
    for _ in range(repeats):
        start = time.process_time()
        trajs = run()
        best = max(best, sum(len(t) for t in trajs) / (time.process_time() - start))
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tasks = make_tasks('all')
    tok = build_tokenizer(tasks)
    torch.manual_seed(0)
    model = TinyAgent(vocab_size=len(tok))
    bench = [tasks[i % len(tasks)] for i in range(args.batch)]
    single = tokens_per_second(
        lambda: [rollout(model, BugFixEnv(), t, tok, generator=torch.Generator().manual_seed(i))
                 for i, t in enumerate(bench[:16])], args.repeats)
    batched = tokens_per_second(
        lambda: rollout_batch(model, [BugFixEnv() for _ in bench], bench, tok,
                              generator=torch.Generator().manual_seed(0)), args.repeats)
    nocache = tokens_per_second(
        lambda: _lockstep(model, [BugFixEnv() for _ in bench], bench, tok, 6, 1.0,
                          torch.Generator().manual_seed(0), use_cache=False), 1)
    result = {'batch_tokens_per_s': round(batched, 1), 'single_tokens_per_s': round(single, 1),
              'speedup': round(batched / single, 2), 'kv_cache_speedup': round(batched / nocache, 2),
              'nocache_tokens_per_s': round(nocache, 1), 'batch_size': args.batch,
              'clock': 'process_time, 1 thread'}
    print(f"rollout (one at a time): {single:9.0f} tokens/s\n"
          f"lockstep, no cache:      {nocache:9.0f} tokens/s\n"
          f"rollout_batch (B={args.batch}):    {batched:9.0f} tokens/s")
    print(json.dumps(result))


if __name__ == '__main__':
    main()
