"""Benchmark probe for Chapter 9: the headline GRPO run, timed.

Builds the tokenizer and make_rl_base, measures the held-out pass rate (16 renamed episodes per
held-out task, temperature 1, one-edit gym), runs train_rl with the default RLConfig exactly as
Section 9.6 does, measures again, and prints ONE JSON line as the last line of stdout:
{"heldout_pass_before", "heldout_pass_after", "episodes_per_eval", "headline_run_s", "episodes_per_s"}.
Usage: OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_grpo.py [--steps 200]
"""
import argparse
import json
import sys
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
    t0 = time.time()
    model = make_rl_base(tok)
    base_s = time.time() - t0
    measure = lambda m: evaluate(m, heldout_tasks, tok, n_samples=n_eval,
                                 generator=torch.Generator().manual_seed(123))
    before = measure(model)
    t0 = time.time()
    history = train_rl(model, train_tasks, tok, RLConfig(), args.steps,
                       eval_tasks=heldout_tasks, eval_every=25)
    run_s = time.time() - t0
    after = measure(model)
    print(f'make_rl_base {base_s:.1f} s; train_rl {args.steps} steps {run_s:.1f} s', file=sys.stderr)
    print(json.dumps({'heldout_pass_before': round(before['pass_rate'], 4),
                      'heldout_pass_after': round(after['pass_rate'], 4),
                      'episodes_per_eval': before['episodes'],
                      'headline_run_s': round(run_s, 2),
                      'episodes_per_s': round(history[-1]['episodes'] / run_s, 1)}))


if __name__ == '__main__':
    main()
