#!/usr/bin/env python3
"""Time to accuracy on this CPU: the demo's whole job in the recipe (`scripts/demo.sh`, through the runner, data
loading, validation and checkpoints included) and in PyTorch (scripts/pytorch_peer.py --train: torchvision's
resnet50 as its classification reference trains it, the same data, schedule and augmentation), in turns.

    python scripts/benchmark_time_to_accuracy.py [--data data/demo] [--rounds 2] [--target 0.95] [--amp]

Each run is timed from its launch (start-up included) to the end of every epoch: the recipe's from the
timestamps of its DLLogger epoch records (written once the epoch's validation and files are done), PyTorch's from
the lines its peer prints. Reports, per run, the wall seconds to reach the target top-1 (--target; default: the
lower of the two final top-1s, an accuracy both reach), the final top-1 and the whole run's seconds, and the best
of --rounds of each. The demo's dataset is made first if missing (as demo.sh makes it). PyTorch runs with the
project's environment that has it, .venv-consumers (`make consumers`; `make test` makes it).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import bootstrap
bootstrap.start()   # the repository importable, .venv

from rn50.reports import logs  # noqa: E402
from rn50.world import cpu  # noqa: E402

ROOT = bootstrap.ROOT


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--data', default=os.path.join(ROOT, 'data', 'demo'), help='the demo dataset (demo.sh\'s)')
    parser.add_argument('--rounds', type=int, default=2, help='runs of each, in turns')
    parser.add_argument('--target', type=float, default=None, help='top-1 to reach (default: both reach it)')
    parser.add_argument('--amp', action='store_true', help='bfloat16 in both (--amp; torch.autocast)')
    return parser.parse_args()


def recipe_run(args, workspace):
    """[(seconds since launch, top-1)] of each epoch of scripts/demo.sh in `workspace`, and the run's seconds."""
    environ = dict(os.environ, DEMO_FLAGS='--amp' if args.amp else '')
    launched = time.time()
    subprocess.run([os.path.join(ROOT, 'scripts', 'demo.sh'), args.data, workspace], check=True, env=environ,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finished = time.time()
    records = [r for r in logs.read_dllogger(os.path.join(workspace, 'dllogger_log.log'))
               if isinstance(r['step'], list) and len(r['step']) == 1 and 'val.accuracy' in r['data']]
    return [(float(r['timestamp']) - launched, r['data']['val.accuracy']) for r in records], finished - launched


def pytorch_run(args):
    """The same of scripts/pytorch_peer.py --train on the demo's images."""
    command = [sys.executable, os.path.join(ROOT, 'scripts', 'pytorch_peer.py'), '--train',
               os.path.join(args.data, 'images')] + (['--amp'] if args.amp else [])
    launched = time.time()
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    finished = time.time()
    epochs = [json.loads(line) for line in output.splitlines() if line.startswith('{')]
    return [(epoch['time'] - launched, epoch['top1']) for epoch in epochs], finished - launched


def demo_dataset(folder):
    """The digits as demo.sh makes them (images/, rec/), before any run is timed."""
    if os.path.exists(os.path.join(folder, 'rec', 'val.idx')):
        return
    images = os.path.join(folder, 'images')
    for command in (['make_demo_dataset.py', images],
                    ['prepare_dataset.py', images, os.path.join(folder, 'rec'), '--names', os.path.join(images,
                                                                                                    'names.txt')]):
        subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', command[0]), *command[1:]], check=True)


def time_to(epochs, target):
    """Seconds to the first epoch at `target` top-1 or above, or None."""
    return next((seconds for seconds, top1 in epochs if top1 >= target - 1e-12), None)


def main():
    args = parse_args()
    demo_dataset(args.data)
    runs = {'recipe': [], 'pytorch': []}
    for round_index in range(args.rounds):
        for name in (('recipe', 'pytorch') if round_index % 2 == 0 else ('pytorch', 'recipe')):
            if name == 'recipe':
                workspace = tempfile.mkdtemp(prefix='time-to-accuracy-')
                try:
                    runs[name].append(recipe_run(args, workspace))
                finally:
                    shutil.rmtree(workspace, ignore_errors=True)
            else:
                runs[name].append(pytorch_run(args))
    target = args.target if args.target is not None else min(epochs[-1][1] for results in runs.values()
                                                              for epochs, _ in results)
    report = {'cpu': cpu.identity(), 'amp': args.amp, 'target_top1': round(target, 4)}
    for name, results in runs.items():
        report[name] = [{'seconds_to_target': round(time_to(epochs, target), 1) if time_to(epochs, target) else None,
                         'final_top1': round(epochs[-1][1], 4), 'seconds': round(seconds, 1),
                         'epochs': [[round(s, 1), round(t, 4)] for s, t in epochs]} for epochs, seconds in results]
    best = {name: min((r['seconds_to_target'] for r in report[name] if r['seconds_to_target']), default=None)
            for name in runs}
    report['best_seconds_to_target'] = best
    if best['recipe'] and best['pytorch']:
        report['recipe_over_pytorch'] = round(best['recipe'] / best['pytorch'], 3)
    print(json.dumps(report))


if __name__ == '__main__':
    main()
