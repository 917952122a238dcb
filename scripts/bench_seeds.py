"""Benchmark probe for Chapter 9: the book's GRPO run over several base seeds and RL seeds.

For each base seed and RL seed, make_grpo_agent (Section 9.6; cached on disk, so a warm cache makes
this quick) gives the trained agent and its history. Each agent and each base agent is measured as
Section 9.6 does: per function body, 16 episodes per task, every episode under its own random name,
on the held-out (validation) and the test split. Reports every run's per-body rates, its test lift
with a 95% interval over the 10 test bodies, the mean and worst lift and the number of runs that
end below a test pass rate of 0.3. Prints one JSON line as the last line of stdout.
Usage: OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_seeds.py [--base-seeds 0 1] [--rl-seeds 0 1 2]
"""
import argparse
import json
import sys
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--base-seeds', type=int, nargs='+', default=[0, 1])
    parser.add_argument('--rl-seeds', type=int, nargs='+', default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    from agentrl.gym import make_tasks
    from agentrl.trajectories import build_tokenizer
    from agentrl.grpo import evaluate_by_body, make_grpo_agent, make_rl_base
    from agentrl.mathtools import mc_mean_and_stderr

    tok = build_tokenizer(make_tasks('all'))
    splits = {'val': make_tasks('heldout'), 'test': make_tasks('test')}

    by_body = lambda model, tasks: evaluate_by_body(model, tasks, tok)    # the measure of Section 9.6

    mean = lambda d: round(sum(d.values()) / len(d), 4)
    runs = []
    for base_seed in args.base_seeds:
        base = make_rl_base(tok, seed=base_seed)
        before = {s: by_body(base, tasks) for s, tasks in splits.items()}
        for rl_seed in args.rl_seeds:
            t0 = time.perf_counter()
            agent, history = make_grpo_agent(tok, base_seed=base_seed, seed=rl_seed)
            seconds = time.perf_counter() - t0
            after = {s: by_body(agent, tasks) for s, tasks in splits.items()}
            gains = torch.tensor([after['test'][v] - before['test'][v] for v in after['test']])
            m, se = mc_mean_and_stderr(gains)
            run = {'base_seed': base_seed, 'rl_seed': rl_seed, 'make_grpo_agent_s': round(seconds, 1),
                   'val_before': mean(before['val']), 'val_after': mean(after['val']),
                   'test_before': mean(before['test']), 'test_after': mean(after['test']),
                   'test_lift': round(m.item(), 4), 'test_lift_ci95': [round(m.item() - 1.96 * se.item(), 4),
                                                                       round(m.item() + 1.96 * se.item(), 4)],
                   'val_per_body_after': after['val'], 'test_per_body_before': before['test'],
                   'test_per_body_after': after['test'],
                   'val_curve': [[r['step'], round(r['eval_pass_rate'], 4)] for r in history if 'eval_pass_rate' in r]
                                + [[len(history), round(history[-1]['final_eval_pass_rate'], 4)]]}
            print(f"base {base_seed} rl {rl_seed}: val {run['val_before']:.3f} -> {run['val_after']:.3f}, "
                  f"test {run['test_before']:.3f} -> {run['test_after']:.3f} ({seconds:.0f} s)",
                  file=sys.stderr, flush=True)
            runs.append(run)
    lifts = [r['test_lift'] for r in runs]
    print(json.dumps({'runs': runs, 'test_lift_mean': round(sum(lifts) / len(lifts), 4),
                      'test_lift_worst': min(lifts),
                      'runs_below_0.3_test': sum(r['test_after'] < 0.3 for r in runs)}))


if __name__ == '__main__':
    main()
