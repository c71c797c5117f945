#!/usr/bin/env python
"""Training-augmentation throughput of the data loaders, side by side, on ImageNet-sized JPEGs.

    python scripts/benchmark_loaders.py [--images 2000] [--batch-size 64] [--workers 2] [--batches 30]

Writes --images synthetic photographs (500x375 JPEGs of about ImageNet's file size) to a RecordIO file once
(in --workdir), then measures, in one run and with the same number of decoding threads or processes:

* the recipe's `dali-cpu` loader (decodes only the random crop region),
* the recipe's `mxnet` loader and a bare `mx.io.ImageRecordIter` with the same settings (the recipe should
  add no cost of its own),
* a plain PIL + NumPy loader in a process pool doing the same random-resized-crop, flip and normalisation.

Prints images/s and the two ratios the recipe is held to: dali-cpu / PIL (target >= 1.5) and
mxnet / bare ImageRecordIter (target >= 0.9).
"""
import argparse
import io
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import data  # noqa: E402
import train  # noqa: E402

MEAN = np.array([123.68, 116.779, 103.939], np.float32)
STD = np.array([58.393, 57.12, 57.375], np.float32)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--images', type=int, default=2000)
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--workers', type=int, default=2, help='decoding threads / processes for every loader')
    parser.add_argument('--batches', type=int, default=30, help='batches timed per loader (after 3 warm-up)')
    parser.add_argument('--workdir', default='/tmp/rn50-loader-benchmark')
    return parser.parse_args()


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


def recipe_batches(args, rec, idx, backend):
    flags = ['--data-train', rec, '--data-train-idx', idx, '--batch-size', str(args.batch_size),
             '--data-backend', backend, '--dali-threads', str(args.workers), '--data-mxnet-threads', str(args.workers),
             '--seed', '1']
    options = train.build_parser().parse_args(flags)
    options.contexts, options.device, options.dtype, options.amp = [mx.cpu()], 'cpu', 'float32', False
    loader = train.get_loaders(options, 0, 1, val=False)[0]
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
    records = data.RecordFile(rec, idx, 1000, 'benchmark')
    order = np.random.default_rng(1).permutation(len(records))
    with open(rec, 'rb') as f:
        payloads = [data.read_record(f, records.offsets[i])[2] for i in order]
    position = 0
    while True:
        jobs = [(payloads[(position + j) % len(payloads)], position + j) for j in range(args.batch_size)]
        position += args.batch_size
        yield np.stack(pool.map(pil_sample, jobs, chunksize=args.batch_size // args.workers))


def main():
    args = parse_args()
    rec, idx = make_dataset(args)
    size = os.path.getsize(rec) / args.images / 1024
    print(f'{args.images} JPEGs of 500x375, {size:.0f} KB on average; batch {args.batch_size}, '
          f'{args.workers} threads/processes, 224x224 training augmentation')
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
