"""Sweep worker counts x per-device batch sizes through the runner into one JSON report, a table and plots.

    python benchmark.py -n 1,4,8 -b 512 --dtype float32 -o report.json -i 500 -e 3 -w 1 --num-examples 32000 \\
        --mode train
    python benchmark.py -n 1 -b 1,2,4,8,16,32,64,128,192,256 -o infer.json -i 500 -e 3 -w 1 --mode val
    python benchmark.py -n 1,2 -b 8,16 -o cpu.json -i 20 -e 2 -w 1 --mode train --data-backend synthetic \\
        --image-shape 3,64,64 --num-layers 18              # on a CPU machine: Gloo workers

Each point is a fresh `./runner -n N -b B --benchmark-iters I -e E --mode M --no-metrics ...` (other flags
are passed through) with its own workspace and logs under `<output>.points/NxB/`. From its DLLogger file the
per-epoch records are read, the first -w epochs dropped, and the rest averaged: harmonic mean for throughput
(*.ips, images/s over all workers, each epoch's warm-up iterations already left out by the recipe), arithmetic mean
for the rest (val.latency_* are seconds per batch: avg, p50, p90, p95, p99, p100).

Output: strict JSON at -o with the original's structure (`model`, `ngpus`, `bs`, `metric_keys`,
`metrics[n][bs]`, string keys) plus `points[n][bs]` (command, exit status, duration, error), `hardware` and
`versions`; a failed point has null metrics and its error instead of the original's NaN tokens. A table per
metric on stdout, and next to the JSON `<output>.throughput.png` (throughput versus batch size, one line per
worker count) and `<output>.scaling.png` (scaling efficiency ips(n) / (n x ips(1)) versus worker count).
"""
import os
import shutil
import subprocess
import sys
import time

from rn50.launch import interpreter
interpreter.use_project_python()   # before any third-party import: finds .venv in a fresh shell

from rn50 import flags  # noqa: E402
from rn50 import files  # noqa: E402
from rn50.reports import logs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# train.epoch_gap: seconds between an epoch's last step and the next one's first, besides validation (fit.py)
METRICS = {'train': ['train.ips', 'train.epoch_gap'],
           'val': ['val.ips', 'val.latency_avg', 'val.latency_50', 'val.latency_90', 'val.latency_95',
                   'val.latency_99', 'val.latency_100'],
           'train_val': ['train.ips', 'train.epoch_gap', 'val.ips', 'val.latency_avg']}


def parse_args(argv=None):
    parser = flags.ArgumentParser(prog='benchmark.py', description=__doc__.split('\n\n')[0],
                                  epilog='Every other flag goes to each point\'s runner command unchanged '
                                  '(`./runner --help`, `python train.py --help`).')
    parser.add_argument('--executable', default=os.path.join(HERE, 'runner'), help='the launcher to benchmark')
    parser.add_argument('-o', '--output', required=True, help='report path (JSON)')
    parser.add_argument('-n', '--ngpus', type=flags.positive_int_list, required=True,
                        help='worker counts, e.g. 1,4,8')
    parser.add_argument('-b', '--batch-sizes', type=flags.positive_int_list, required=True,
                        help='per-device batch sizes')
    parser.add_argument('-i', '--benchmark-iters', type=flags.integer(minimum=1), default=100,
                        help='iterations per epoch')
    parser.add_argument('-e', '--epochs', type=flags.integer(minimum=1), default=1, help='epochs per point')
    parser.add_argument('-w', '--warmup', type=flags.integer(minimum=0), default=0,
                        help='first epochs left out of the averages')
    parser.add_argument('--timeout', type=flags.real(minimum=0, exclusive=True), default=None,
                        help='seconds allowed per point')
    parser.add_argument('--mode', default='train_val', choices=sorted(METRICS), help='what to measure')
    args, forwarded = parser.parse_known_args(argv)
    if args.warmup >= args.epochs:
        parser.error(f'-w {args.warmup} leaves no epoch of -e {args.epochs} to measure')
    return args, forwarded


def point_command(args, forwarded, workers, batch, folder):
    return [args.executable, '-n', str(workers), '-b', str(batch), '--benchmark-iters', str(args.benchmark_iters),
            '-e', str(args.epochs), '--mode', args.mode, '--no-metrics', '--workspace', folder,
            '--dllogger-log', os.path.join(folder, 'dllogger.log')] + forwarded


def summarise(records, keys, warmup):
    """Per-epoch DLLogger records -> one value per metric (harmonic mean of throughputs)."""
    epochs = [r['data'] for r in records if isinstance(r['step'], list) and len(r['step']) == 1][warmup:]
    if not epochs:
        raise ValueError('no epoch records after the warm-up epochs')
    result = {}
    for key in keys:
        values = [e[key] for e in epochs if key in e]
        if not values:
            raise ValueError(f'no {key} in the epoch records')
        result[key] = len(values) / sum(1 / v for v in values) if key.endswith('ips') else sum(values) / len(values)
    return result


def run_point(args, forwarded, workers, batch):
    """(metrics or None, point record) for one (workers, batch) launch."""
    folder = os.path.abspath(f'{args.output}.points/{workers}x{batch}')
    shutil.rmtree(folder, ignore_errors=True)     # a rerun measures afresh: no earlier log is read as this one's
    os.makedirs(folder)
    command = point_command(args, forwarded, workers, batch, folder)
    record = {'command': command, 'returncode': None, 'duration': None, 'error': None,
              'log': os.path.join(folder, 'output.log')}
    started = time.time()
    with open(record['log'], 'w') as output:
        try:
            completed = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, timeout=args.timeout)
            record['returncode'] = completed.returncode
        except subprocess.TimeoutExpired:
            record['error'] = f'timed out after {args.timeout} s'
    record['duration'] = time.time() - started
    if record['error'] is None and record['returncode'] != 0:
        record['error'] = f'exit status {record["returncode"]}: ' + last_lines(record['log'])
    if record['error'] is not None:
        return None, record
    try:
        return summarise(logs.read_dllogger(os.path.join(folder, 'dllogger.log')), METRICS[args.mode],
                         args.warmup), record
    except (OSError, ValueError) as e:
        record['error'] = f'unreadable results: {e}'
        return None, record


class UserError(Exception):
    """A point's runner exited with status 2: an `error:` line the user must act on."""


def last_lines(path, count=5):
    with open(path, errors='replace') as f:
        return ' | '.join(line.strip() for line in f.readlines()[-count:])


def report_skeleton(args, forwarded):
    arch = forwarded[forwarded.index('--arch') + 1] if '--arch' in forwarded else 'resnetv15'
    return {'model': arch, 'ngpus': args.ngpus, 'bs': args.batch_sizes, 'metric_keys': METRICS[args.mode],
            'metrics': {}, 'points': {}, 'mode': args.mode, 'hardware': logs.hardware(),
            'versions': logs.library_versions(all_known=True)}


def print_tables(report):
    for key in report['metric_keys']:
        print(f'\n{key}')
        print(' workers |' + '|'.join(f'{b:^11}' for b in report['bs']))
        for n in report['ngpus']:
            cells = []
            for b in report['bs']:
                value = report['metrics'].get(str(n), {}).get(str(b), {}).get(key)
                cells.append(f'{value:^11.5g}' if value is not None else f'{"failed":^11}')
            print(f'{n:^9}|' + '|'.join(cells))


def workers_text(n):
    return f'{n} worker' + ('' if n == 1 else 's')


def plot(report, output):
    """Throughput versus batch size per worker count (batch sizes on a log2 axis, throughput from 0), and
    scaling efficiency versus worker count where there are at least two worker counts to compare. Returns
    the files written, and says on stderr which plot was left out and why."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    key = report['metric_keys'][0]
    value = lambda n, b: report['metrics'].get(str(n), {}).get(str(b), {}).get(key)  # noqa: E731
    if all(value(n, b) is None for n in report['ngpus'] for b in report['bs']):
        print('benchmark: no plots: every point failed', file=sys.stderr)
        return []
    figure, axes = plt.subplots()
    for n in report['ngpus']:
        axes.plot(report['bs'], [value(n, b) for b in report['bs']], marker='o', label=workers_text(n))
    axes.set_xscale('log', base=2)
    axes.set_xticks(report['bs'], [str(b) for b in report['bs']])
    axes.set_ylim(bottom=0)
    axes.set(xlabel='batch size per device', ylabel=f'{key} (images/s)', title='Throughput')
    axes.legend()
    figure.savefig(f'{output}.throughput.png')
    plt.close(figure)
    if len(report['ngpus']) < 2:
        print('benchmark: no scaling plot: it needs at least two worker counts (-n)', file=sys.stderr)
        return [f'{output}.throughput.png']
    figure, axes = plt.subplots()
    base = min(report['ngpus'])
    for b in report['bs']:
        efficiency = [value(n, b) / (n / base * value(base, b)) if value(n, b) and value(base, b) else None
                      for n in report['ngpus']]
        axes.plot(report['ngpus'], efficiency, marker='o', label=f'batch {b} per device')
    baseline = 'n x images/s of 1 worker' if base == 1 else f'n/{base} x images/s of {base} workers'
    axes.set(xlabel='workers (n)', ylabel=f'images/s of n workers / ({baseline})', title='Scaling efficiency',
             ylim=(0, 1.2), xticks=report['ngpus'])
    axes.legend()
    figure.savefig(f'{output}.scaling.png')
    plt.close(figure)
    return [f'{output}.throughput.png', f'{output}.scaling.png']


def main(argv=None):
    args, forwarded = parse_args(argv)
    report = report_skeleton(args, forwarded)
    # Each sweep's folder holds its own points only: a failed point of an earlier sweep is not left behind.
    shutil.rmtree(f'{args.output}.points', ignore_errors=True)
    try:
        for n in args.ngpus:
            for b in args.batch_sizes:
                print(f'benchmark: {n} workers x batch {b} ...', file=sys.stderr, flush=True)
                metrics, record = run_point(args, forwarded, n, b)
                report['metrics'].setdefault(str(n), {})[str(b)] = metrics or {k: None for k in report['metric_keys']}
                report['points'].setdefault(str(n), {})[str(b)] = record
                if record['error']:
                    print(f'benchmark: {n}x{b} failed: {record["error"]}', file=sys.stderr)
                files.write_json(args.output, report)
                if record['returncode'] == 2:   # a user error (missing data, a bad flag): every point would repeat it
                    raise UserError(record['error'])
    except UserError as e:
        print(f'error: {e} (the sweep stopped at its first point: every other point would fail the same way)',
              file=sys.stderr)
    except KeyboardInterrupt:
        print('benchmark: interrupted; the report holds the points measured so far', file=sys.stderr)
    files.write_json(args.output, report)
    print_tables(report)
    plots = plot(report, args.output)
    print(f'\nReport: {args.output}' + (f'; plots: {", ".join(plots)}' if plots else ''))
    failed = sum(1 for row in report['points'].values() for p in row.values() if p['error'])
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
