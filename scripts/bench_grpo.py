"""Benchmark probe for Chapter 9: make_rl_base uncached and cached, and the headline GRPO run, timed.

Builds the tokenizer; times make_rl_base with an empty weights cache (it trains) and again (it
loads), and checks that both give bit-identical weights; measures the held-out pass rate (16 renamed
episodes per held-out task, temperature 1, one-edit gym), runs train_rl with the default RLConfig as
Section 9.6 does, measures again, and prints ONE JSON line as the last line of stdout.
Usage: OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_grpo.py [--steps 200]
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=200, help='train_rl steps (Section 9.6 uses 200)')
    args = parser.parse_args()
    torch.set_num_threads(1)
    from agentrl.gym import make_tasks
    from agentrl.trajectories import build_tokenizer
    from agentrl.grpo import RLConfig, evaluate, make_rl_base, train_rl

    n_eval = 16
    tok = build_tokenizer(make_tasks('all'))
    train_tasks, heldout_tasks = make_tasks('train'), make_tasks('heldout')
    with tempfile.TemporaryDirectory() as cache:
        os.environ['AGENTRL_CACHE'] = cache                     # empty: the first call trains
        t0 = time.perf_counter()
        fresh = make_rl_base(tok)
        uncached_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = make_rl_base(tok)
        cached_s = time.perf_counter() - t0
    identical = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    measure = lambda m: evaluate(m, heldout_tasks, tok, n_samples=n_eval,
                                 generator=torch.Generator().manual_seed(123))
    before = measure(model)
    t0 = time.perf_counter()
    history = train_rl(model, train_tasks, tok, RLConfig(), args.steps,
                       eval_tasks=heldout_tasks, eval_every=25)
    run_s = time.perf_counter() - t0
    after = measure(model)
    print(f'make_rl_base {uncached_s:.1f} s (cached {cached_s:.2f} s); train_rl {args.steps} steps {run_s:.1f} s',
          file=sys.stderr)
    print(json.dumps({'make_rl_base_uncached_s': round(uncached_s, 2), 'make_rl_base_cached_s': round(cached_s, 3),
                      'cached_weights_identical': identical,
                      'heldout_pass_before': round(before['pass_rate'], 4),
                      'heldout_pass_after': round(after['pass_rate'], 4),
                      'episodes_per_eval': before['episodes'],
                      'headline_run_s': round(run_s, 2),
                      'episodes_per_s': round(history[-1]['episodes'] / run_s, 1)}))


if __name__ == '__main__':
    main()
