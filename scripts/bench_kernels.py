"""Probe: is an RL run the same on another CPU? GRPO (Chapter 9) under two sets of CPU kernels.

Runs train_rl from make_rl_base for --steps steps in child processes: with torch's and MKL's default
kernels for this CPU and with both switched to another instruction set (AVX512 -> AVX2, otherwise the
portable baseline), each with RLConfig's weight grid (the default) and without it (weight_grid=None).
For each pair of runs it reports the largest |loss difference| per block of 10 steps, the first step at
which the sampled rewards differ, and whether the final weights are bit-identical. Last stdout line: JSON.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch
torch.set_num_threads(1); torch.set_default_dtype(torch.float64)
from agentrl.gym import make_tasks
from agentrl.trajectories import build_tokenizer
from agentrl.grpo import RLConfig, make_rl_base, train_rl
steps, grid = int(sys.argv[1]), (None if sys.argv[2] == 'none' else float(sys.argv[2]))
tok = build_tokenizer(make_tasks('all'))
model = make_rl_base(tok)
h = train_rl(model, make_tasks('train'), tok, RLConfig(weight_grid=grid), steps)
print(torch.backends.cpu.get_cpu_capability())
print(json.dumps([[r['reward'], r.get('loss')] for r in h]))
print(json.dumps([p.flatten().tolist()[:64] for p in model.parameters()]))
print(repr(sum(float(p.double().sum()) for p in model.parameters())))
"""


def run(steps, grid, env):
    out = subprocess.run([sys.executable, '-c', CHILD, str(steps), grid], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return {'kernels': out[0], 'history': json.loads(out[1]), 'sample': json.loads(out[2]), 'sum': float(out[3])}


def compare(a, b):
    diffs = [abs((x[1] or 0.0) - (y[1] or 0.0)) for x, y in zip(a['history'], b['history'])]
    first = next((i for i, (x, y) in enumerate(zip(a['history'], b['history'])) if x[0] != y[0]), None)
    return {'kernels': f"{a['kernels']} vs {b['kernels']}",
            'max_loss_diff_per_10_steps': [float(f'{max(diffs[i:i + 10]):.1e}') for i in range(0, len(diffs), 10)],
            'first_step_rewards_differ': first,
            'final_weights_identical': a['sample'] == b['sample'] and a['sum'] == b['sum']}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=150)
    args = ap.parse_args()
    import torch
    other = {'ATEN_CPU_CAPABILITY': 'avx2', 'MKL_ENABLE_INSTRUCTIONS': 'AVX2'} \
        if torch.backends.cpu.get_cpu_capability() == 'AVX512' else \
        {'ATEN_CPU_CAPABILITY': 'default', 'MKL_ENABLE_INSTRUCTIONS': 'SSE4_2'}
    base = {'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
    result = {'steps': args.steps}
    for name, grid in (('weight_grid_default', repr(2.0 ** -20)), ('no_weight_grid', 'none')):
        result[name] = compare(run(args.steps, grid, base), run(args.steps, grid, {**base, **other}))
        print(name, result[name])
    print(json.dumps(result))


if __name__ == '__main__':
    main()
