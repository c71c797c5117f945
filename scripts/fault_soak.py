#!/usr/bin/env python
"""The soak class of scripts/fault_campaign.py: many epochs through every training backend's loaders, a
training run of many short epochs, each with no failure and no temporary file left behind, and many 2-worker
runs stopped by SIGTERM, each with its state written. A rare failure
(the native loader's chunk files once made one epoch in 20 fail: issue 24) shows only over many epochs.

    from fault_soak import soak_campaign
    soak_campaign(camp, epochs)          # camp: fault_campaign.Campaign (datasets, rows)
    python scripts/fault_soak.py BACKEND REC IDX EPOCHS     # one backend's reading, in a process of its own

The reading follows the case of issue 24: 20,000 records of 8x8 JPEGs (labels i % 10), 64 per batch, the loaders
of 2 workers in one process read in turn, every 4th epoch abandoned midway as a --benchmark-iters wrap or a
stop does. Each runs with TMPDIR set to a folder of its own, which must hold
no file after any epoch and nothing at all once the loaders are gone.
"""
import argparse
import gc
import io
import json
import os
import shutil
import time

import bootstrap
if __name__ == '__main__':
    bootstrap.start()   # .venv in a fresh shell (the campaign runs this file as a program to read a backend's epochs)
from fault_tools import ENV, PY, ROOT, run, temporaries  # noqa: E402

BACKENDS = ('mxnet', 'dali-cpu', 'synthetic')
RECORDS, SIDE, BATCH, WORKERS = 20000, 8, 128, 2     # 64 per worker: chunks of 4 batches, as in the issue
# The training run: the digits at 8x8, 8 steps of 64 per epoch (2 chunks of the native loader), validation
# (359 images) after every epoch.
TRAINING_EXAMPLES, TRAINING_BATCH = 512, 64


def soak_dataset(folder, make=True):
    """The issue's dataset (made once; `make` False: its files' names only): RECORDS JPEGs of SIDExSIDE random
    pixels, label i % 10."""
    rec, idx = os.path.join(folder, 'soak.rec'), os.path.join(folder, 'soak.idx')
    if os.path.exists(idx) or not make:
        return rec, idx
    import numpy as np
    from PIL import Image
    from rn50.data import records
    os.makedirs(folder, exist_ok=True)
    with records.RecordWriter(rec, idx + '.part') as writer:
        for i in range(RECORDS):
            pixels = np.random.default_rng(i).integers(0, 255, size=(SIDE, SIDE, 3), dtype=np.uint8)
            encoded = io.BytesIO()
            Image.fromarray(pixels).save(encoded, format='JPEG')
            writer.write(i, float(i % 10), encoded.getvalue())
    os.replace(idx + '.part', idx)      # the index last: its presence means a complete dataset
    return rec, idx


def files_below(folder):
    return [os.path.join(top, name) for top, _, names in os.walk(folder) for name in names]


def read_epochs(backend, rec, idx, epochs):
    """Read `epochs` epochs of the loaders of WORKERS workers; print one JSON line of counts."""
    bootstrap.on_path()
    import data
    import train
    from rn50.config import resolve
    args, origin = train.parse_flags([
        '--data-backend', backend, '--batch-size', str(BATCH), '--image-shape', f'3,{SIDE},{SIDE}',
        '--min-random-area', '1', '--seed', '3', '--mode', 'train', '--data-train', rec, '--data-train-idx', idx,
        '--num-classes', '10', '--num-examples', str(RECORDS), '--data-val-resize', str(SIDE),
        '--data-mxnet-threads', '2', '--dali-threads', '2'])
    args = resolve.for_run(args, origin, on_gpu=False)[0]
    data.check_backend(args, origin.given, on_gpu=False)
    loaders = [train.get_loaders(args, rank, WORKERS, val=False)[0] for rank in range(WORKERS)]
    tmp = os.environ['TMPDIR']
    counts = {'epochs': epochs, 'batches': 0, 'failures': 0, 'first_failure': '', 'files left after an epoch': 0}
    for epoch in range(epochs):
        try:
            counts['batches'] += read_epoch(loaders, epoch, abandon=epoch % 4 == 3)
        except Exception as e:     # any failure of an epoch counts; the next epoch starts afresh
            counts['failures'] += 1
            counts['first_failure'] = counts['first_failure'] or f'epoch {epoch}: {type(e).__name__}: {str(e)[:160]}'
        counts['files left after an epoch'] += len(files_below(tmp))
    del loaders
    gc.collect()
    counts['left at the end'] = sorted(os.listdir(tmp))
    print(json.dumps(counts))


def read_epoch(loaders, epoch, abandon):
    """The batches of `epoch` of each loader in turn (all of them, or half when `abandon`), as fast as they
    come: a consumer that never waits leaves the loader's own threads the least slack."""
    read = 0
    for loader in loaders:
        reader = loader.epoch(epoch)
        try:
            for _ in zip(range(loader.num_batches // 2 if abandon else loader.num_batches), reader):
                read += 1
        finally:
            reader.close()
    return read


def read_argv(backend, rec, idx, epochs):
    """This file as a program: `epochs` epochs of REC/IDX through `backend`'s loaders."""
    return [PY, os.path.abspath(__file__), backend, rec, idx, str(epochs)]


def training_argv(rec, ws, epochs):
    """The training soak's train.py run: the digits of RecordIO folder `rec` at 8x8, `epochs` short epochs."""
    return [PY, os.path.join(ROOT, 'train.py'), '--data-backend', 'mxnet', '--data-train',
            os.path.join(rec, 'train.rec'), '--data-train-idx', os.path.join(rec, 'train.idx'), '--data-val',
            os.path.join(rec, 'val.rec'), '--data-val-idx', os.path.join(rec, 'val.idx'), '--num-classes', '10',
            '--image-shape', '3,8,8', '--data-val-resize', '8', '--num-layers', '18', '--batch-size',
            str(TRAINING_BATCH),
            '--num-examples', str(TRAINING_EXAMPLES), '--num-epochs', str(epochs), '--warmup-epochs', '1',
            '--lr', '0.1', '--seed', '3', '--data-mxnet-threads', '2', '--workspace', ws]


def signal_argv(ws):
    """The signal soak's run: `./runner -n 2`, ResNet-18 on synthetic data, one epoch."""
    return [PY, os.path.join(ROOT, 'runner'), '-n', '2', '-b', '16', '-e', '1', '--data-backend', 'synthetic',
            '--num-layers', '18', '--image-shape', '3,32,32', '--num-classes', '10', '--num-examples', '4096',
            '--disp-batches', '1', '--seed', '1', '--workspace', ws]


def read_soak(camp, backend, rec, idx, epochs):
    name = f'soak/{backend}: {epochs} epochs of {WORKERS} loaders'
    if not camp.selected(name):
        return
    start = time.time()
    tmp = os.path.join(camp.workdir, 'soak-tmp', backend)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    code, out, err = run(read_argv(backend, rec, idx, epochs), env=dict(ENV, TMPDIR=tmp), timeout=None)
    lines = [line for line in out.splitlines() if line.startswith('{')]
    if code != 0 or not lines:
        camp.row(name, 'every epoch read; no file left', f'exit {code}: {err.strip()[-200:]}', False,
                 time.time() - start)
        return
    counts = json.loads(lines[-1])
    ok = counts['failures'] == 0 and counts['files left after an epoch'] == 0 and not counts['left at the end']
    camp.row(name, 'every epoch read; no file left',
             f'{counts["epochs"]} epochs, {counts["batches"]} batches, {counts["failures"]} failures'
             f'{"; " + counts["first_failure"] if counts["first_failure"] else ""}; files left: '
             f'{counts["files left after an epoch"]} after epochs, {len(counts["left at the end"])} at the end', ok,
             time.time() - start)


def training_soak(camp, epochs):
    """train.py on the digits with the native loader: many short epochs, validation after each."""
    name = f'soak/training: {epochs} short epochs, mxnet loader'
    if not camp.selected(name):
        return
    start = time.time()
    rec = camp.digits()
    ws, tmp = camp.fresh('soak-training'), os.path.join(camp.workdir, 'soak-tmp', 'training')
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    code, out, err = run(training_argv(rec, ws, epochs), env=dict(ENV, TMPDIR=tmp), timeout=None)
    from rn50.reports import logs
    records = [r for r in logs.read_dllogger(os.path.join(ws, 'dllogger_log.log'))
               if isinstance(r['step'], list) and len(r['step']) == 1] if os.path.exists(ws) else []
    left = files_below(tmp) + temporaries(ws)
    ok = code == 0 and len(records) == epochs and not left
    why = '' if code == 0 else f' ({[l for l in err.splitlines() if "error" in l.lower()][-1:] or err[-150:]})'
    camp.row(name, 'exit 0, every epoch logged, no file left',
             f'exit {code}{why}, {len(records)} epochs logged ({epochs * TRAINING_EXAMPLES // TRAINING_BATCH} steps), '
             f'{len(left)} files left', ok, time.time() - start)


def signal_soak(camp, tries):
    """Issue 28 item 12: `./runner -n 2` (ResNet-18, synthetic data), SIGTERM to the runner 2 s after the first
    logged step, `tries` times: every run must exit 0 with model_last.state written (one in about 22 once
    ended with exit status 1 and no state)."""
    name = f'soak/signal: SIGTERM to a 2-worker runner, {tries} runs'
    if not camp.selected(name):
        return
    import signal
    import subprocess
    start, failures = time.time(), []
    for attempt in range(tries):
        ws = camp.fresh(f'soak-signal-{attempt}')
        process = subprocess.Popen(signal_argv(ws), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=ENV, start_new_session=True)
        lines, due = [], None
        for line in process.stdout:
            lines.append(line)
            due = due or (time.time() + 2 if 'Iteration:' in line else None)
            if due and due > 0 and time.time() >= due:
                process.send_signal(signal.SIGTERM)
                due = -1
        code = process.wait()
        if code != 0 or not os.path.exists(os.path.join(ws, 'model_last.state')):
            failures.append(f'run {attempt}: exit {code}, {lines[-1].strip()[-150:] if lines else "no output"}')
    camp.row(name, 'every run exits 0 with the state written', f'{tries - len(failures)} of {tries} did'
             + (f'; first failure: {failures[0]}' if failures else ''), not failures, time.time() - start)


def soak_commands(camp, epochs):
    """(row class, argv) of every command line the soak rows run with `epochs`, built as they build them, without
    running or making anything (tests/test_faults.py parses them)."""
    rec, idx = soak_dataset(os.path.join(camp.workdir, 'soak-data'), make=False)
    runs = os.path.join(camp.workdir, 'runs')
    return [(f'soak/{backend}', read_argv(backend, rec, idx, epochs)) for backend in BACKENDS] + \
        [('soak/training', training_argv(camp.digits(make=False), os.path.join(runs, 'soak-training'), epochs)),
         ('soak/signal', signal_argv(os.path.join(runs, 'soak-signal-0')))]


def soak_campaign(camp, epochs):
    """The soak rows: each backend's loaders for `epochs` epochs, a training run of `epochs` epochs, and as many
    runs stopped by SIGTERM."""
    names = [f'soak/{backend}' for backend in BACKENDS] + ['soak/training', 'soak/signal']
    if not any(camp.selected(n) for n in names):
        return
    rec, idx = soak_dataset(os.path.join(camp.workdir, 'soak-data'))
    for backend in BACKENDS:
        read_soak(camp, backend, rec, idx, epochs)
    training_soak(camp, epochs)
    signal_soak(camp, epochs)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='The soak\'s reading of one training backend (fault_campaign.py '
                                     'runs it): EPOCHS epochs of REC/IDX through BACKEND\'s loaders')
    parser.add_argument('backend', choices=BACKENDS)
    parser.add_argument('rec')
    parser.add_argument('idx')
    parser.add_argument('epochs', type=int)
    return parser.parse_args(argv)


if __name__ == '__main__':
    options = parse_args()
    read_epochs(options.backend, options.rec, options.idx, options.epochs)
