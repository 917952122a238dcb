"""Benchmark probe for Section 9.9: every method of METHODS, three RL seeds, from base seed 0.

For each method and seed, make_method_agent (cached on disk: `make warm` fills the cache) gives the
trained agent, its history and the seconds its training took when it ran. Each agent is scored as
Section 9.9 does: evaluate_by_body on the test split (16 episodes per task, 10 bodies). Reports per run
the test pass rate, the validation pass rate at the end, the training episodes until the 10-step mean
train pass rate first reached 0.5 and the training seconds; per method the mean test pass rate, the
lift over the base agent with a 95% interval over the 10 bodies (per-body gains averaged over the
seeds), and the worst seed. Prints one JSON line as the last line of stdout.
Usage: OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_methods.py [--seeds 0 1 2] [--methods NAME ...]
"""
import argparse
import json
import sys

import torch


def first_reaching(history, level=0.5, k=10):
    "Training episodes sampled when the k-step mean train pass rate first reaches level (None: never)."
    rates = [r['pass_rate'] for r in history]
    for i in range(k - 1, len(rates)):
        if sum(rates[i - k + 1:i + 1]) / k >= level:
            return history[i]['episodes']
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--methods', nargs='+', default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    from agentrl.gym import make_tasks
    from agentrl.trajectories import build_tokenizer
    from agentrl.grpo import METHODS, evaluate_by_body, make_method_agent, make_rl_base
    from agentrl.mathtools import mc_mean_and_stderr

    tok = build_tokenizer(make_tasks('all'))
    test = make_tasks('test')
    base = evaluate_by_body(make_rl_base(tok, seed=0), test, tok)
    mean = lambda d: round(sum(d.values()) / len(d), 4)
    out = {'base_test': mean(base), 'methods': {}}
    for name in args.methods or list(METHODS):
        runs, after = [], []
        for seed in args.seeds:
            agent, history, seconds = make_method_agent(tok, name, base_seed=0, seed=seed)
            rates = evaluate_by_body(agent, test, tok)
            after.append(rates)
            runs.append({'seed': seed, 'test': mean(rates), 'val_final': round(history[-1]['final_eval_pass_rate'], 4),
                         'episodes_to_train_pass_0.5': first_reaching(history), 'train_seconds': round(seconds, 1)})
            print(f'{name} seed {seed}: test {runs[-1]["test"]:.3f} ({seconds:.0f} s)', file=sys.stderr, flush=True)
        gains = torch.tensor([sum(a[v] - base[v] for a in after) / len(after) for v in base])
        m, se = mc_mean_and_stderr(gains)
        out['methods'][name] = {'runs': runs, 'test_mean': round(sum(r['test'] for r in runs) / len(runs), 4),
                                'test_worst': min(r['test'] for r in runs), 'lift': round(m.item(), 4),
                                'lift_ci95': [round(m.item() - 1.96 * se.item(), 4), round(m.item() + 1.96 * se.item(), 4)]}
    print(json.dumps(out))


if __name__ == '__main__':
    main()
