#!/usr/bin/env python3
"""Data loader benchmarks: throughput on ImageNet-sized JPEGs, and (issue 15) the training order, start-up
and resume at ImageNet scale, each optionally against the code of another git revision.

    python scripts/benchmark_loaders.py [--images 2000] [--batch-size 64] [--workers 2] [--batches 30]
    python scripts/benchmark_loaders.py --baseline REV --rounds 3      # throughput, this code vs REV's (REV: from
                                                                       # the rn50/ layout on, train.parse_flags)
    python scripts/benchmark_loaders.py --order [--baseline REV]       # order of epoch 1 against epoch 0
    python scripts/benchmark_loaders.py --startup [--baseline REV]     # loaders on a 1,281,167-record index
    python scripts/benchmark_loaders.py --resume [--baseline REV]      # start at 90% of a 100,000-record epoch
    python scripts/benchmark_loaders.py --augmentations --rounds 3     # dali-cpu with each of augment.py's pieces
    python scripts/benchmark_loaders.py --gil --rounds 2               # the training thread beside the reader

Throughput: writes --images synthetic photographs (500x375 JPEGs of about ImageNet's file size) to a
RecordIO file once (in --workdir), then measures, with the same number of decoding threads or processes:

* the recipe's `dali-cpu` loader (decodes only the random crop region),
* the recipe's `mxnet` loader and a bare `mx.io.ImageRecordIter` with the same settings (the recipe should
  add no cost of its own),
* a plain PIL + NumPy loader in a process pool doing the same random-resized-crop, flip and normalisation.

Prints images/s and the two ratios the recipe is held to: dali-cpu / PIL (target >= 1.5) and
mxnet / bare ImageRecordIter (target >= 0.9). With --baseline REV, the recipe's loaders of this tree and of
REV (exported with `git archive` to --workdir) are measured in interleaved rounds, each measurement in its
own process, and the median of --rounds is compared (target: new >= 0.95 x old).

--order: a 20,000-record file whose labels are the record indices, read for epochs 0 and 1 through the
recipe's loaders by 2 workers with --batch-size 64 (global); prints the correlation of each record's position
in epoch 1 with its position in epoch 0 (goal |r| < 0.05) and how much more often than fresh random batches
two records that shared a (global) batch in epoch 0 share one again (goal <= 1.3x).
--startup: the time to build the training loader of rank 0 of 8 on a 1,281,167-record synthetic .idx/.rec
(goal <= 3 s), and to its first batch, twice in one process (first: files possibly read from disk; again:
from the page cache). --resume: the time to the first batch of epoch(0, k) with k at 90% of a
100,000-record epoch, against k = 0. --augmentations: the recipe's dali-cpu throughput without and with each
automatic augmentation policy and random erasing (augment.py), in interleaved rounds, the median of each.
--gil: a training thread beside the recipe's dali-cpu loader (whose feed thread reads the records and parses
their JPEG headers in Python): per batch it runs a fixed piece of pure Python (a step's queueing) and sleeps 50 ms
(the device's part, the lock free); its Python time and its wait for the next batch, with the page cache of the
.rec warm and dropped (posix_fadvise DONTNEED before the loader is made), through the mmap and with positioned
reads (--dali-dont-use-mmap), in --rounds rounds.
"""
import argparse
import io
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

import bootstrap
bootstrap.start(prepare_cpu=True)   # .venv in a fresh shell, this CPU prepared for MXNet

ROOT = bootstrap.ROOT


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--images', type=int, default=2000)
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--workers', type=int, default=2, help='decoding threads / processes for every loader')
    parser.add_argument('--batches', type=int, default=30, help='batches timed per loader (after 3 warm-up)')
    parser.add_argument('--workdir', default='/tmp/rn50-loader-benchmark')
    parser.add_argument('--baseline', help='git revision whose loaders to measure too, in interleaved rounds')
    parser.add_argument('--rounds', type=int, default=3, help='interleaved rounds with --baseline')
    parser.add_argument('--order', action='store_true', help='order quality of epoch 1 against epoch 0')
    parser.add_argument('--startup', action='store_true', help='loader start-up on a 1,281,167-record index')
    parser.add_argument('--resume', action='store_true', help='start time at 90%% of a 100,000-record epoch')
    parser.add_argument('--augmentations', action='store_true', help='dali-cpu with and without each augmentation')
    parser.add_argument('--gil', action='store_true', help='the training thread beside the reader, cache warm/cold')
    parser.add_argument('--measure', help=argparse.SUPPRESS)      # internal: one measurement in this process
    parser.add_argument('--code', default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument('--backend', help=argparse.SUPPRESS)
    parser.add_argument('--extra', default='[]', help=argparse.SUPPRESS)   # internal: more train.py flags (JSON)
    return parser.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.code)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import data  # noqa: E402
import train  # noqa: E402
from rn50.config import resolve  # noqa: E402
from rn50.data import contract  # noqa: E402

MEAN = np.array([123.68, 116.779, 103.939], np.float32)
STD = np.array([58.393, 57.12, 57.375], np.float32)
BACKENDS = ('dali-cpu', 'mxnet')


def photograph(seed):
    """A 500x375 image with smooth structure and texture, so its JPEG is about ImageNet-sized (~110 KB)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500].astype(np.float32)
    base = np.stack([np.sin(x / rng.uniform(20, 80) + c) * np.cos(y / rng.uniform(20, 80) - c)
                     for c in rng.uniform(0, 6, 3)], axis=-1)
    pixels = 128 + 90 * base + rng.normal(0, 18, (375, 500, 3))
    buffer = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format='JPEG', quality=90)
    return buffer.getvalue()


def make_dataset(args):
    rec, idx = os.path.join(args.workdir, 'bench.rec'), os.path.join(args.workdir, 'bench.idx')
    if not os.path.exists(idx):
        os.makedirs(args.workdir, exist_ok=True)
        writer = mx.recordio.MXIndexedRecordIO(idx + '.tmp', rec, 'w')
        for i in range(args.images):
            writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 1000), i, 0), photograph(i)))
        writer.close()
        os.replace(idx + '.tmp', idx)
    return rec, idx


RECORD_MAGIC = 0xced7230a   # the first 4 bytes of every RecordIO record


def make_small_dataset(workdir, name, count, classes, side=24):
    """`count` records of one small JPEG each (side x side), label i % classes, written with numpy in one go
    (1.28 M records in seconds): for order, start-up and resume, where decoding is not the point."""
    rec, idx = os.path.join(workdir, f'{name}.rec'), os.path.join(workdir, f'{name}.idx')
    if os.path.exists(idx):
        return rec, idx
    os.makedirs(workdir, exist_ok=True)
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format='JPEG', quality=90)
    jpeg = buffer.getvalue()
    length = 24 + len(jpeg)
    stride = 8 + (length + 3) // 4 * 4
    rows = np.zeros((count, stride), np.uint8)
    head = np.zeros(count, dtype=[('magic', '<u4'), ('length', '<u4'), ('flag', '<u4'), ('label', '<f4'),
                                  ('id', '<u8'), ('id2', '<u8')])
    head['magic'], head['length'] = RECORD_MAGIC, length
    head['label'] = np.arange(count) % classes
    head['id'] = np.arange(count)
    rows[:, :32] = head.view(np.uint8).reshape(count, 32)
    rows[:, 32:32 + len(jpeg)] = np.frombuffer(jpeg, np.uint8)
    rows.tofile(rec)
    with open(idx + '.tmp', 'w') as f:
        f.write('\n'.join(f'{i}\t{i * stride}' for i in range(count)) + '\n')
    os.replace(idx + '.tmp', idx)
    return rec, idx


def options(flags):
    """train.py's flags resolved for this CPU machine (float32, no AMP)."""
    args, origin = train.parse_flags(flags)
    return resolve.for_run(args, origin, on_gpu=False)[0]


def get_loaders(args, rank, workers, **which):
    """The recipe's loader factory: train.get_loaders, or data.get_loaders in revisions before the layout
    change (--baseline may name one)."""
    factory = getattr(train, 'get_loaders', None) or getattr(data, 'get_loaders')
    return factory(args, rank, workers, **which)


def timed(batches, count):
    """images/s over `count` batches after 3 warm-up batches; each batch is forced to exist."""
    images = 0
    for i, batch in enumerate(batches):
        if i == 3:
            start = time.time()
        if i >= 3:
            images += batch.shape[0] if isinstance(batch, np.ndarray) else batch.data[0].shape[0]
        (batch if isinstance(batch, np.ndarray) else batch.data[0].wait_to_read())
        if i == 3 + count - 1:
            break
    return images / (time.time() - start)


def recipe_batches(args, rec, idx, backend, extra=()):
    flags = ['--data-train', rec, '--data-train-idx', idx, '--batch-size', str(args.batch_size),
             '--data-backend', backend, '--dali-threads', str(args.workers), '--data-mxnet-threads', str(args.workers),
             '--seed', '1'] + list(extra)
    loader = get_loaders(options(flags), 0, 1, val=False)[0]
    epoch = 0
    while True:
        yield from loader.epoch(epoch)
        epoch += 1


def bare_batches(args, rec, idx):
    iterator = mx.io.ImageRecordIter(
        path_imgrec=rec, path_imgidx=idx, data_shape=(3, 224, 224), batch_size=args.batch_size, shuffle=True,
        seed=1, round_batch=True, rand_mirror=1, random_resized_crop=1, min_random_area=0.08, max_random_area=1,
        min_aspect_ratio=0.75, max_aspect_ratio=1.33, preprocess_threads=args.workers, mean_r=MEAN[0],
        mean_g=MEAN[1], mean_b=MEAN[2], std_r=STD[0], std_g=STD[1], std_b=STD[2])
    while True:
        yield from iterator
        iterator.reset()


def pil_sample(job):
    """Decode, random-resized-crop (8-100% area, 3/4-4/3 aspect), resize to 224, flip, normalise: CHW."""
    payload, seed = job
    rng = np.random.default_rng(seed)
    with Image.open(io.BytesIO(payload)) as image:
        image = image.convert('RGB')
        width, height = image.size
        for _ in range(10):
            area = width * height * rng.uniform(0.08, 1.0)
            aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            w, h = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
            if w <= width and h <= height:
                break
        else:
            w, h = min(width, height), min(width, height)
        left, top = rng.integers(0, width - w + 1), rng.integers(0, height - h + 1)
        crop = image.resize((224, 224), Image.BILINEAR, box=(left, top, left + w, top + h))
    pixels = np.asarray(crop, np.float32)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def pil_batches(args, rec, idx, pool):
    from rn50.data import records   # this tree's only: --baseline trees before records.py never run the PIL loader
    dataset = records.RecordFile(rec, idx, 1000, 'benchmark')
    order = np.random.default_rng(1).permutation(len(dataset))
    with open(rec, 'rb') as f:
        payloads = [records.read_record(f, dataset.offsets[i])[2] for i in order]
    position = 0
    while True:
        jobs = [(payloads[(position + j) % len(payloads)], position + j) for j in range(args.batch_size)]
        position += args.batch_size
        yield np.stack(pool.map(pil_sample, jobs, chunksize=args.batch_size // args.workers))


# ----------------------------------------------------------------------------------------------------------
# Measurements run in their own process (--measure), so that two versions of the code can be compared


def measure_throughput(args):
    rec, idx = make_dataset(args)
    extra = json.loads(args.extra)
    return {'images_per_s': timed(recipe_batches(args, rec, idx, args.backend, extra), args.batches)}


def measure_order(args):
    """Per record, its position and its global batch (the step: batch i of every worker) in epochs 0 and 1,
    read through the recipe's loaders by 2 workers with --batch-size 64 (global; 32 per worker); the labels
    are the record indices. Pair recurrence compares how often two records of one global batch of epoch 0
    share a global batch of epoch 1 with the (batch - 1) / (records - 1) of fresh random batches."""
    count, workers, batch = 20000, 2, 64
    per_worker = batch // workers
    rec, idx = make_small_dataset(args.workdir, 'order', count, count, side=16)
    flags = ['--data-train', rec, '--data-train-idx', idx, '--num-classes', str(count), '--image-shape', '3,16,16',
             '--batch-size', str(batch), '--data-backend', args.backend, '--seed', '1',
             '--dali-threads', str(args.workers), '--data-mxnet-threads', str(args.workers)]
    position = np.full((2, count), -1.0)
    step = np.full((2, count), -1)
    for rank in range(workers):
        loader = get_loaders(options(flags), rank, workers, val=False)[0]
        for epoch in (0, 1):
            for i, b in enumerate(loader.epoch(epoch)):
                labels = b.label[0].asnumpy().astype(np.int64)[:per_worker - b.pad]
                position[epoch, labels] = i * batch + rank * per_worker + np.arange(len(labels))
                step[epoch, labels] = i
    seen = (position >= 0).all(axis=0)
    r = float(np.corrcoef(position[0, seen], position[1, seen])[0, 1])
    together = pairs = 0
    for g in np.unique(step[0, seen]):
        members = step[1, seen][step[0, seen] == g]
        counts = np.unique(members, return_counts=True)[1]
        together += int((counts * (counts - 1) // 2).sum())
        pairs += len(members) * (len(members) - 1) // 2
    recurrence = together / pairs / ((batch - 1) / (seen.sum() - 1))
    return {'r': r, 'pair_recurrence': float(recurrence), 'records_seen': int(seen.sum())}


def measure_startup(args):
    rec, idx = make_small_dataset(args.workdir, 'imagenet-size', contract.IMAGENET_TRAIN_SIZE, 1000, side=8)
    flags = ['--data-train', rec, '--data-train-idx', idx, '--num-classes', '1000', '--batch-size', '256',
             '--image-shape', '3,24,24', '--data-backend', args.backend, '--seed', '1',
             '--dali-threads', str(args.workers), '--data-mxnet-threads', str(args.workers)]
    result = {}
    for attempt in ('first', 'again'):      # the first may read the files from disk, the second from the cache
        begin = time.time()
        loader = get_loaders(options(flags), 0, 8, val=False)[0]
        ready = time.time()
        next(iter(loader.epoch(0))).data[0].wait_to_read()
        result.update({f'{attempt}_ready_s': ready - begin, f'{attempt}_first_batch_s': time.time() - ready})
        del loader
    return result


def measure_resume(args):
    rec, idx = make_small_dataset(args.workdir, 'resume', 100000, 1000, side=64)
    flags = ['--data-train', rec, '--data-train-idx', idx, '--num-classes', '1000', '--batch-size', '64',
             '--image-shape', '3,32,32', '--data-backend', args.backend, '--seed', '1',
             '--dali-threads', str(args.workers), '--data-mxnet-threads', str(args.workers)]
    result = {}
    warm_up = get_loaders(options(flags), 0, 1, val=False)[0]    # libraries loaded, files cached
    next(iter(warm_up.epoch(1))).data[0].wait_to_read()
    del warm_up
    for name, fraction in (('fresh_s', 0), ('resume_90_s', 0.9)):
        loader = get_loaders(options(flags), 0, 1, val=False)[0]
        begin = time.time()
        next(iter(loader.epoch(0, int(fraction * loader.num_batches)))).data[0].wait_to_read()
        result[name] = time.time() - begin
    return result


MEASURES = {'throughput': measure_throughput, 'order': measure_order, 'startup': measure_startup,
            'resume': measure_resume}


def run_measure(args, what, backend, code, extra=()):
    command = [sys.executable, os.path.abspath(__file__), '--measure', what, '--backend', backend, '--code', code,
               '--workdir', args.workdir, '--images', str(args.images), '--batch-size', str(args.batch_size),
               '--workers', str(args.workers), '--batches', str(args.batches), '--extra', json.dumps(list(extra))]
    result = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith('{')]
    if result.returncode or not lines:
        raise SystemExit(f'{" ".join(command)} failed:\n{result.stderr[-3000:]}')
    return json.loads(lines[-1])


def export_revision(args):
    """The tree of --baseline, exported (not checked out) to --workdir."""
    revision = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', args.baseline], capture_output=True,
                              text=True, check=True).stdout.strip()
    folder = os.path.join(args.workdir, f'code-{revision}')
    if not os.path.exists(folder):
        os.makedirs(folder + '.tmp', exist_ok=True)
        archive = subprocess.run(['git', '-C', ROOT, 'archive', revision], capture_output=True, check=True).stdout
        subprocess.run(['tar', '-x', '-C', folder + '.tmp'], input=archive, check=True)
        os.replace(folder + '.tmp', folder)
    return revision, folder


def compare(args, what):
    """`what` for both backends, for this tree and (with --baseline) REV's, in interleaved rounds."""
    versions = [('this tree', ROOT)]
    if args.baseline:
        revision, folder = export_revision(args)
        versions.append((f'{args.baseline} ({revision})', folder))
    rounds = args.rounds if what == 'throughput' else 1
    results = {}
    for round_index in range(rounds):
        for backend in BACKENDS:
            for name, code in (versions if round_index % 2 == 0 else versions[::-1]):
                value = run_measure(args, what, backend, code)
                results.setdefault((backend, name), []).append(value)
                print(f'  round {round_index + 1}: {backend:8} {name:24} {value}', flush=True)
    print(f'{what}: {cpu_name()}, {os.cpu_count()} cores')
    for (backend, name), values in results.items():
        keys = values[0].keys()
        summary = {k: statistics.median(v[k] for v in values) for k in keys}
        print(f'  {backend:8} {name:24} ' + ', '.join(f'{k} {v:.4g}' for k, v in summary.items()))
    if args.baseline and what == 'throughput':
        for backend in BACKENDS:
            new, old = ([v['images_per_s'] for v in results[backend, name]] for name, _ in versions)
            paired = statistics.median(n / o for n, o in zip(new, old))
            print(f'  {backend}: this tree / baseline = {statistics.median(new) / statistics.median(old):.3f} '
                  f'(medians), {paired:.3f} (median of the rounds\' ratios); target >= 0.95')


AUGMENTATIONS = {'none': [], 'ta_wide': ['--auto-augment', 'ta_wide'], 'ra (2 ops, m9)': ['--auto-augment', 'ra'],
                 'imagenet': ['--auto-augment', 'imagenet'], 'erase 0.25 const': ['--random-erase', '0.25'],
                 'erase 0.25 pixel': ['--random-erase', '0.25', '--random-erase-mode', 'pixel']}


def compare_augmentations(args):
    """dali-cpu throughput without and with each piece of augment.py, in interleaved rounds."""
    make_dataset(args)
    results = {}
    for round_index in range(args.rounds):
        names = list(AUGMENTATIONS) if round_index % 2 == 0 else list(AUGMENTATIONS)[::-1]
        for name in names:
            value = run_measure(args, 'throughput', 'dali-cpu', ROOT, AUGMENTATIONS[name])['images_per_s']
            results.setdefault(name, []).append(value)
            print(f'  round {round_index + 1}: {name:18} {value:.1f} images/s', flush=True)
    base = statistics.median(results['none'])
    print(f'dali-cpu, batch {args.batch_size}, {args.workers} threads, 224x224: {cpu_name()}, {os.cpu_count()} cores')
    for name, values in results.items():
        print(f'  {name:18} {statistics.median(values):8.1f} images/s  ({statistics.median(values) / base:.2f}x)')


def python_work(n=20000):
    """A fixed piece of pure Python (needs the interpreter's lock): the host's queueing of a step."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def training_thread(args, rec, idx, extra, cold, device_seconds=0.05):
    """(mean and 90th percentile of the wait for a batch, the same of the Python piece), ms, over one epoch of
    the dali-cpu loader beside a training thread (the --gil docstring)."""
    from rn50.data import records   # this tree's only (as in pil_batches)
    if cold:
        records.drop_page_cache(rec)
    flags = ['--data-train', rec, '--data-train-idx', idx, '--batch-size', str(args.batch_size),
             '--data-backend', 'dali-cpu', '--dali-threads', str(args.workers), '--seed', '1', *extra]
    loader = get_loaders(options(flags), 0, 1, val=False)[0]
    if cold:
        records.drop_page_cache(rec)     # making the loader read some records' headers
    waits, pieces = [], []
    asked = time.perf_counter()
    for batch in loader.epoch(0):
        waits.append(time.perf_counter() - asked)
        start = time.perf_counter()
        python_work()
        pieces.append(time.perf_counter() - start)
        time.sleep(device_seconds)
        asked = time.perf_counter()
    waits, pieces = np.array(waits[2:]) * 1e3, np.array(pieces[2:]) * 1e3
    return waits.mean(), np.percentile(waits, 90), pieces.mean(), np.percentile(pieces, 90)


def measure_gil(args):
    rec, idx = make_dataset(args)
    start = time.perf_counter()
    python_work()
    print(f'{args.images} JPEGs of 500x375, batch {args.batch_size}, {args.workers} DALI threads; the Python piece '
          f'alone {(time.perf_counter() - start) * 1e3:.2f} ms, the device\'s part 50 ms; {cpu_name()}')
    for round_ in range(args.rounds):
        for name, extra in (('mmap', []), ('pread', ['--dali-dont-use-mmap'])):
            for cold in (False, True):
                wait, wait90, piece, piece90 = training_thread(args, rec, idx, extra, cold)
                print(f'round {round_}: {name:5} {"cold" if cold else "warm"}: wait {wait:6.2f} ms (p90 {wait90:6.2f}), '
                      f'Python {piece:5.2f} ms (p90 {piece90:5.2f})', flush=True)


def cpu_name():
    from rn50.world import cpu
    return cpu.identity()


def main():
    args = ARGS
    if args.measure:
        print(json.dumps(MEASURES[args.measure](args)))
        return
    for what in ('order', 'startup', 'resume'):
        if getattr(args, what):
            compare(args, what)
            return
    if args.augmentations:
        compare_augmentations(args)
        return
    if args.gil:
        measure_gil(args)
        return
    if args.baseline:
        compare(args, 'throughput')
        return
    rec, idx = make_dataset(args)
    size = os.path.getsize(rec) / args.images / 1024
    print(f'{args.images} JPEGs of 500x375, {size:.0f} KB on average; batch {args.batch_size}, '
          f'{args.workers} threads/processes, 224x224 training augmentation; {cpu_name()}')
    rates = {'dali-cpu (recipe)': timed(recipe_batches(args, rec, idx, 'dali-cpu'), args.batches),
             'mxnet (recipe)': timed(recipe_batches(args, rec, idx, 'mxnet'), args.batches),
             'ImageRecordIter (bare)': timed(bare_batches(args, rec, idx), args.batches)}
    with multiprocessing.Pool(args.workers) as pool:
        rates['PIL + NumPy pool'] = timed(pil_batches(args, rec, idx, pool), args.batches)
    for name, rate in rates.items():
        print(f'  {name:24} {rate:8.1f} images/s')
    print(f'dali-cpu / PIL:             {rates["dali-cpu (recipe)"] / rates["PIL + NumPy pool"]:.2f} (target >= 1.5)')
    print(f'mxnet / bare ImageRecordIter: {rates["mxnet (recipe)"] / rates["ImageRecordIter (bare)"]:.2f} '
          '(target >= 0.9)')


if __name__ == '__main__':
    main()
