"""Fill the weights cache with every cached training run of the book, on two CPU cores, half of them
on switched CPU kernels.

The notebooks load trained agents from the on-disk cache (cache_dir(), Section 6.5). A cold cache
makes Chapter 9 train 29 runs, Chapter 10 nine more, Chapter 11 eighteen, Chapter 13 eighteen, Chapter 14 six,
Chapter 15 eighteen (plus three shortened GRPO runs), Chapter 16 nine (plus its small student's start) and Chapter 18 24 short ones, in
one process each; this script trains them first, in two processes at once. Worker 0 uses this
machine's default CPU kernels, worker 1 the kernels that the switched-kernel regression uses
(tests/notebook_runner.switched_kernels).
Each missing run is trained once, by one of them; the notebook regressions then load it. Since
every stored output was produced on this machine's default kernels, a run trained by worker 1 that
reproduces those outputs shows that training is the same on another instruction set. Runs already
in the cache are loaded, not trained again (their key holds the library code, so a code change
retrains them).
Usage: .venv/bin/python scripts/warm_cache.py [--workers 2]   (make test runs it first)
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# (function, base seed, method / run name or None, RL seed, rough cost in seconds on one thread)
BASES = [('make_rl_base', 0, None, None, 150), ('make_rl_base', 1, None, None, 150)]


def jobs():
    "Every cached run the notebooks ask for, as JSON-able tuples; the two base agents first."
    sys.path.insert(0, str(ROOT))
    from agentrl.grpo import METHODS
    cost = {'PPO actor-critic': 230, 'GRPO': 120}
    runs = [('make_method_agent', b, 'DAPO (book default)', s, 100) for b in (0, 1) for s in (0, 1, 2)]
    runs += [('make_method_agent', 0, m, s, cost.get(m, 90)) for m in METHODS if m != 'DAPO (book default)'
             for s in (0, 1, 2)]
    from agentrl.regularization import REGULARIZED_RUNS                 # Chapter 10
    runs += [('make_regularized_agent', 0, name, s, 110) for name in REGULARIZED_RUNS for s in (0, 1, 2)]
    from agentrl.rewards import REWARD_RUNS                             # Chapter 11
    runs += [('make_reward_agent', 0, name, s, 110 if kw.get('steps', 200) == 200 else 55)
             for name, kw in REWARD_RUNS.items() for s in (0, 1, 2)]
    from agentrl.rollout import OFFPOLICY_RUNS                          # Chapter 13
    runs += [('make_offpolicy_agent', 0, name, s, 60) for name in OFFPOLICY_RUNS for s in (0, 1, 2)]
    from agentrl.scaling import CURRICULUM_RUNS                         # Chapter 14
    runs += [('make_curriculum_agent', 0, name, s, 120) for name in CURRICULUM_RUNS for s in (0, 1, 2)]
    from agentrl.sft import SFT_RUNS, SFT_BUDGET                        # Chapter 15
    runs += [('make_sft_agent', 0, name, s, 60) for name in SFT_RUNS for s in (0, 1, 2)]
    from agentrl.sft import SFT_CONTROL_LR                              # the same runs at the other lr
    runs += [('make_sft_agent', 0, [name, lr], s, 60)
             for name, lr in SFT_CONTROL_LR.items() for s in (0, 1, 2)]
    # Chapter 9's GRPO run stopped at Chapter 15's episode budget; the 'method' slot holds the steps
    runs += [('make_grpo_agent', 0, SFT_BUDGET // 64, s, 30) for s in (0, 1, 2)]
    from agentrl.distill import DISTILL_RUNS                            # Chapter 16 (its student base first)
    runs += [('make_distill_agent', 0, name, s, 40) for name in DISTILL_RUNS for s in (0, 1, 2)]
    from agentrl.debugging import BUGS                                  # Chapter 18: healthy + 7 faults
    runs += [('make_debug_run', 0, bug, s, 15 if bug == 'old_logp_padding' else 70) for bug in [None, *BUGS]
             for s in (0, 1, 2)]
    return BASES, runs


def split(workers):
    "Longest job first to the least loaded worker; base agent w goes to worker w."
    bases, runs = jobs()
    plans = [[bases[w]] if w < len(bases) else [] for w in range(workers)]
    loads = [sum(j[-1] for j in p) for p in plans]
    for job in sorted(runs, key=lambda j: -j[-1]):
        w = loads.index(min(loads))
        plans[w].append(job)
        loads[w] += job[-1]
    return plans


def work(plan):
    "Run one worker's jobs in order (in this process)."
    import torch
    from tqdm.auto import tqdm
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    from agentrl.gym import make_tasks
    from agentrl.trajectories import build_tokenizer
    from agentrl.grpo import make_rl_base, make_method_agent
    from agentrl.regularization import make_regularized_agent, REGULARIZED_RUNS
    from agentrl.rewards import make_reward_agent, REWARD_RUNS
    from agentrl.rollout import make_offpolicy_agent, OFFPOLICY_RUNS
    from agentrl.scaling import make_curriculum_agent
    from agentrl.sft import make_sft_agent
    from agentrl.grpo import make_grpo_agent
    from agentrl.distill import make_distill_agent
    from agentrl.debugging import make_debug_run
    tok = build_tokenizer(make_tasks('all'))
    for fn, base_seed, method, seed, _ in tqdm(plan, desc=f'warm {torch.backends.cpu.get_cpu_capability()}'):
        start = time.perf_counter()
        if fn == 'make_rl_base':
            make_rl_base(tok, seed=base_seed)
        elif fn == 'make_regularized_agent':
            make_regularized_agent(tok, base_seed=base_seed, seed=seed, **REGULARIZED_RUNS[method])
        elif fn == 'make_reward_agent':
            make_reward_agent(tok, base_seed=base_seed, seed=seed, **REWARD_RUNS[method])
        elif fn == 'make_offpolicy_agent':
            make_offpolicy_agent(tok, base_seed=base_seed, seed=seed, **OFFPOLICY_RUNS[method])
        elif fn == 'make_curriculum_agent':
            make_curriculum_agent(tok, method, base_seed=base_seed, seed=seed)
        elif fn == 'make_sft_agent':
            name, lr = method if isinstance(method, list) else (method, None)
            make_sft_agent(tok, name, base_seed=base_seed, seed=seed, lr=lr)
        elif fn == 'make_grpo_agent':
            make_grpo_agent(tok, base_seed=base_seed, seed=seed, steps=method)
        elif fn == 'make_distill_agent':                 # trains the student base and the teacher if missing
            make_distill_agent(tok, method, seed=seed)
        elif fn == 'make_debug_run':
            make_debug_run(tok, bug=method, seed=seed, base_seed=base_seed)
        else:
            make_method_agent(tok, method, base_seed=base_seed, seed=seed)
        print(f'{fn} base {base_seed} {method or ""} seed {seed}: {time.perf_counter() - start:.1f} s',
              file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--plan', help=argparse.SUPPRESS)          # a worker's jobs, as JSON
    args = parser.parse_args()
    if args.plan:
        work(json.loads(args.plan))
        return
    sys.path.insert(0, str(ROOT / 'tests'))
    from notebook_runner import switched_kernels
    start = time.perf_counter()
    plans, procs = split(args.workers), []
    for w, plan in enumerate(plans):
        env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONHASHSEED='0')
        if w % 2 == 1:
            env.update(switched_kernels())
        procs.append(subprocess.Popen([sys.executable, __file__, '--plan', json.dumps(plan)], env=env))
    codes = [p.wait() for p in procs]
    print(f'warm_cache: {sum(len(p) for p in plans)} runs present after '
          f'{time.perf_counter() - start:.0f} s', file=sys.stderr)
    sys.exit(max(codes))


if __name__ == '__main__':
    main()
