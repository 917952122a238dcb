"""Benchmark: execute every notebook `--repeats` times and record the median seconds.

Also runs each `scripts/bench_*.py` probe (each prints one JSON object on its last stdout line)
and stores what it reports under "probes". Writes JSON to --out and prints a table.
Budgets (2-core CPU): each chapter <= 180 s, the whole book <= 1200 s. Every notebook entry and
probe records the machine it was measured on (CPU model, torch's CPU kernels, date): machines of
the same size differ in speed by up to about 2x, so compare figures from one machine only.
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHAPTER_BUDGET, BOOK_BUDGET = 180.0, 1200.0


def time_notebook(path):
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / path.name
        start = time.perf_counter()
        subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(ROOT / 'nbs'),
                        '--no-progress-bar', str(path), str(out)], env=env, check=True,
                       capture_output=True)
        return time.perf_counter() - start


def machine_tag():
    "Which machine a measurement comes from: CPU model, torch's CPU kernels, date (UTC)."
    import torch
    cpuinfo = pathlib.Path('/proc/cpuinfo')
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((l.split(':', 1)[1].strip() for l in lines if l.startswith('model name')), platform.processor())
    return {'cpu': model or 'unknown', 'kernels': torch.backends.cpu.get_cpu_capability(),
            'date': time.strftime('%Y-%m-%d', time.gmtime())}


def run_probe(path, tag):
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1'))
    if run.returncode != 0:
        return {'error': run.stderr[-500:]}
    return {**json.loads(run.stdout.strip().splitlines()[-1]), 'measured_on': tag}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--out', default='bench/results.json')
    ap.add_argument('--only', nargs='*', help='notebook stems to time (default: all); with --only the '
                    'other notebooks and the probes are kept from the existing --out file')
    ap.add_argument('--probes', nargs='*', help='run only these probes (e.g. grpo kernels) and no notebook; '
                    'everything else is kept from the existing --out file')
    args = ap.parse_args()
    notebooks = sorted((ROOT / 'nbs').glob('*.ipynb'))
    if args.only:
        notebooks = [p for p in notebooks if p.stem in args.only]
    if args.probes is not None:
        notebooks = []
    results, tag = {}, machine_tag()
    for nb in notebooks:
        runs = [time_notebook(nb) for _ in range(args.repeats)]
        results[nb.stem] = {'median_s': round(statistics.median(runs), 2),
                            'runs_s': [round(r, 2) for r in runs],
                            'within_budget': statistics.median(runs) <= CHAPTER_BUDGET,
                            'measured_on': tag}
        print(f'{nb.stem:28s} median {results[nb.stem]["median_s"]:7.2f} s  runs {results[nb.stem]["runs_s"]}',
              flush=True)
    out = ROOT / args.out
    partial = args.only or args.probes is not None
    old = json.loads(out.read_text()) if partial and out.exists() else {}
    results = {**old.get('notebooks', {}), **results}
    results = {k: results[k] for k in sorted(results)}
    total = round(sum(r['median_s'] for r in results.values()), 2)
    probe_paths = {p.stem.removeprefix('bench_'): p for p in sorted((ROOT / 'scripts').glob('bench_*.py'))}
    if args.probes is not None:
        probes = {**old.get('probes', {}),
                  **{name: run_probe(path, tag) for name, path in probe_paths.items() if name in args.probes}}
    elif args.only and 'probes' in old:
        probes = old['probes']
    else:
        probes = {name: run_probe(path, tag) for name, path in probe_paths.items()}
    for name, value in probes.items():
        print(f'probe {name}: {value}')
    report = {'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                          'threads': 1, 'repeats': old.get('machine', {}).get('repeats', args.repeats)
                          if args.probes is not None else args.repeats},
              'notebooks': results, 'total_median_s': total,
              'budget': {'chapter_s': CHAPTER_BUDGET, 'book_s': BOOK_BUDGET,
                         'book_within_budget': total <= BOOK_BUDGET},
              'probes': probes}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + '\n')
    print(f'total {total:.2f} s (budget {BOOK_BUDGET:.0f} s) -> {out.relative_to(ROOT)}')


if __name__ == '__main__':
    main()
