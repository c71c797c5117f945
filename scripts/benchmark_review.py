#!/usr/bin/env python3
"""What the end-of-run review costs at ImageNet's size (rn50/review/): 50,000 validation images, 1,000 classes,
synthetic outputs, on this CPU.

    python scripts/benchmark_review.py [--images 50000] [--classes 1000] [--batch 250] [--rounds 3]

Times, each the median of --rounds: the outcomes a validation pass records beside its metrics (log-softmax of each
batch's outputs, copied to the host, added to the table: the pass's extra cost), the figures (per class,
confusion, most confused, calibration, worst images), the pictures (per-class histogram, reliability diagram; the
sheet of the 16 worst images, read from a .rec of 16 photo-sized JPEGs and preprocessed as validation does) and
the page. Prints one JSON object with the CPU named (cpu.identity).
"""
import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time

import bootstrap
bootstrap.start(prepare_cpu=True)   # the repository importable, .venv, this CPU for MXNet

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from rn50.data import contract, records  # noqa: E402
from rn50.data.validation_resize import OpenCVImages  # noqa: E402
from rn50.inference import evaluation# noqa: E402
from rn50.review import compose, outcomes, page  # noqa: E402
from rn50.world import cpu, workers  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--images', type=int, default=50000)
    parser.add_argument('--classes', type=int, default=1000)
    parser.add_argument('--batch', type=int, default=250)
    parser.add_argument('--rounds', type=int, default=3)
    return parser.parse_args(argv)


def synthetic_outputs(images, classes, seed=0):
    """(labels, logits) of a model about 76% right: the true class's logit raised above noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, images)
    logits = rng.normal(size=(images, classes)).astype(np.float32)
    logits[np.arange(images), labels] += 3.2
    return labels, logits


def photo_records(folder, count, classes):
    """A .rec/.idx/.lst of `count` 500x375 JPEG photographs (noise over gradients, as a camera's file size)."""
    from PIL import Image
    rec, idx = os.path.join(folder, 'val.rec'), os.path.join(folder, 'val.idx')
    rng = np.random.default_rng(1)
    with records.RecordWriter(rec, idx) as writer, open(os.path.join(folder, 'val.lst'), 'w') as listing:
        for i in range(count):
            gradient = np.linspace(0, 255, 500)[None, :, None] * np.ones((375, 1, 3))
            pixels = np.clip(gradient + rng.normal(0, 40, (375, 500, 3)), 0, 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format='JPEG', quality=90)
            writer.write(i, float(i % classes), buffer.getvalue())
            listing.write(f'{i}\t{float(i % classes):f}\tclass_{i % classes}/photo_{i:05d}.jpg\n')
    return rec, idx


def timed(function, rounds):
    """(median seconds, last result) of `rounds` calls."""
    seconds, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def main(argv=None):
    args = parse_args(argv)
    labels, logits = synthetic_outputs(args.images, args.classes)
    names = [f'class {c}' for c in range(args.classes)]
    world = workers.World()

    starts = range(0, args.images, args.batch)
    batches = [(mx.nd.array(logits[s:s + args.batch]), mx.nd.array(labels[s:s + args.batch]), np.arange(s, min(
        s + args.batch, args.images))) for s in starts]     # the network's outputs, as a pass has them

    def record_pass():
        table = outcomes.OutcomeTable(args.images)
        for output, label, positions in batches:
            evaluation.record_outcomes(table, [output], [label], len(positions), positions)
        return table.gathered(world.comm)
    figures = {}
    figures[f'outcomes of a pass ({args.images} images, batches of {args.batch}), gathered'], table = timed(
        record_pass, args.rounds)
    # the 16 worst images are the first records of a small .rec: the sheet reads and preprocesses 16 photos
    loss = table.column('loss')
    loss[:16] = loss.max() + 1 + np.arange(16)[::-1]
    images = contract.Images(shape=(3, 224, 224))
    with tempfile.TemporaryDirectory() as folder:
        rec, idx = photo_records(folder, 16, args.classes)
        subject = compose.Subject(names=tuple(names), val=(rec, idx), images=images)
        figures['figures alone (per class, confusion, calibration, worst)'], _ = timed(
            lambda: outcomes.review_figures(table, names), args.rounds)
        figures['figures and pictures (compose.validation_review)'], (review, pictures) = timed(
            lambda: compose.validation_review(subject, table, OpenCVImages(images).prepare), args.rounds)
        path = os.path.join(folder, 'report_val.html')
        figures['page (report_val.html)'], _ = timed(lambda: page.write_page(path, page.Page(
            'benchmark', (), review, pictures)), args.rounds)
        size = os.path.getsize(path)
    print(json.dumps({'cpu': cpu.identity(), 'images': args.images, 'classes': args.classes, 'rounds': args.rounds,
                      'seconds': {k: round(v, 3) for k, v in figures.items()}, 'page_bytes': size,
                      'pictures': sorted(k for k, v in pictures.items() if v)}, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
