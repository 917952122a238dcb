"""Probe: rollout throughput of Chapter 5 (agentrl.trajectories) on an untrained TinyAgent.

Measures trajectory tokens per CPU-second (time.process_time, one thread) for one-episode-at-a-time
`rollout` (16 episodes) and for lockstep `rollout_batch` at batch size --batch, in float64 (the
book's dtype) and float32. Each of --repeats repeats takes the best of --best runs of each path and
reports their ratio; the headline is the smallest ratio over the float64 repeats. CPU time rather
than wall time, so that other programs on a shared machine distort the ratios less. Also the lockstep
engine without its KV cache, once. The same two paths also sample from the book's RL
starting point (make_rl_base(tok, 0), float64, from the weights cache): its episodes are short and
irregular, so the batch carries padding and stragglers, and the ratio is far smaller than on the
untrained agent's uniform 8-token calls (--no-trained skips it). The last stdout line is one JSON object.
"""
import argparse
import json
import time

import torch

from agentrl.gym import BugFixEnv, make_tasks
from agentrl.policies import TinyAgent
from agentrl.trajectories import _lockstep, build_tokenizer, rollout, rollout_batch


def tokens_per_second(run, best_of):
    "Best of best_of calls of run() -> (trajectory tokens per CPU-second, tokens of one call)."
    best = 0.0
    for _ in range(best_of):
        start = time.process_time()
        tokens = sum(len(t) for t in run())
        best = max(best, tokens / (time.process_time() - start))
    return best, tokens


def measure(dtype, tasks, tok, batch, repeats, best_of, model=None):
    if model is None:
        torch.manual_seed(0)
        model = TinyAgent(vocab_size=len(tok), dtype=dtype)
    bench = [tasks[i % len(tasks)] for i in range(batch)]
    single = lambda: [rollout(model, BugFixEnv(), t, tok, generator=torch.Generator().manual_seed(i))
                      for i, t in enumerate(bench[:16])]
    batched = lambda: rollout_batch(model, [BugFixEnv() for _ in bench], bench, tok,
                                    generator=torch.Generator().manual_seed(0))
    rows = []
    for _ in range(repeats):
        (s, _), (b, tokens) = tokens_per_second(single, best_of), tokens_per_second(batched, best_of)
        rows.append({'single_tokens_per_s': round(s, 1), 'batch_tokens_per_s': round(b, 1), 'ratio': round(b / s, 2)})
    nocache, _ = tokens_per_second(lambda: _lockstep(model, [BugFixEnv() for _ in bench], bench, tok, 6, 1.0,
                                                  torch.Generator().manual_seed(0), use_cache=False), 1)
    return {'repeats': rows, 'min_ratio': min(r['ratio'] for r in rows),
            'kv_cache_speedup': round(max(r['batch_tokens_per_s'] for r in rows) / nocache, 2),
            'tokens_per_episode': round(tokens / batch, 1)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--best', type=int, default=5)
    parser.add_argument('--no-trained', dest='trained', action='store_false',
                        help="skip the measurement on make_rl_base's agent (float64)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tasks = make_tasks('all')
    tok = build_tokenizer(tasks)
    result = {'batch_size': args.batch, 'clock': 'process_time, 1 thread', 'best_of': args.best}
    runs = [('float64', torch.float64, None), ('float32', torch.float32, None)]
    if args.trained:
        from agentrl.grpo import make_rl_base
        runs.append(('float64_rl_base', torch.float64, make_rl_base(tok, 0)))
    for name, dtype, model in runs:
        result[name] = measure(dtype, tasks, tok, args.batch, args.repeats, args.best, model)
        for r in result[name]['repeats']:
            print(f"{name}: rollout {r['single_tokens_per_s']:8.0f} tokens/s   rollout_batch (B={args.batch}) "
                  f"{r['batch_tokens_per_s']:8.0f} tokens/s   ratio {r['ratio']:.2f}")
    result['speedup'] = result['float64']['min_ratio']
    print(json.dumps(result))


if __name__ == '__main__':
    main()
