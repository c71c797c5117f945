#!/usr/bin/env python3
"""Write the demo dataset: real images that need no network, as an ImageNet-style folder tree.

    python scripts/make_demo_dataset.py OUT [--size 32] [--val-fraction 0.2] [--seed 0]
    python scripts/make_demo_dataset.py OUT --task parity --train-per-class 10    # a fine-tuning task

The UCI handwritten digits that scikit-learn ships (1,797 grey 8x8 images, 10 classes) are upscaled
(bicubic) to --size pixels square and saved as RGB JPEGs (quality 95) in OUT/train/digit_<d>/<n>.jpg and
OUT/val/digit_<d>/<n>.jpg, split per class (stratified) with the fixed seed. OUT/names.txt names the classes
for scripts/prepare_dataset.py --names. Re-running with the same arguments writes identical files.

`--task parity` groups the same images into two classes, even and odd digits, and `--train-per-class N`
keeps N training images per class (the first N of the seeded order): a different task with few examples,
on which a network fine-tuned from the demo model can be compared with one trained from scratch
(scripts/finetune_demo.sh). The validation split is the same for both tasks.
"""
import argparse
import os
import sys

import bootstrap
bootstrap.start()   # the repository importable, .venv: before any third-party import

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

NAMES = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine']


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out', help='output folder')
    parser.add_argument('--size', type=int, default=32, help='side of the square images in pixels')
    parser.add_argument('--val-fraction', type=float, default=0.2, help='share of each class for validation')
    parser.add_argument('--seed', type=int, default=0, help='seed of the train/val split')
    parser.add_argument('--task', default='digits', choices=['digits', 'parity'],
                        help='digits: 10 classes; parity: 2 classes, even and odd digits')
    parser.add_argument('--train-per-class', type=int, default=None,
                        help='keep at most this many training images per class')
    return parser.parse_args(argv)


def split_indices(labels, val_fraction, seed):
    """Per class, a seeded permutation; its first round(n * val_fraction) images go to validation."""
    rng = np.random.default_rng(seed)
    val = []
    for digit in range(10):
        members = rng.permutation(np.flatnonzero(labels == digit))
        val.extend(members[:int(round(len(members) * val_fraction))].tolist())
    return set(val)


def to_image(pixels, size):
    """An 8x8 image with values 0..16 (ink = high) as a size x size RGB image, dark digit on white."""
    grey = (255 - pixels * (255 / 16)).clip(0, 255).astype(np.uint8)
    return Image.fromarray(grey).resize((size, size), Image.BICUBIC).convert('RGB')


def class_folder(task, digit):
    if task == 'parity':
        return 'odd' if digit % 2 else 'even'
    return f'digit_{digit}'


def main(argv=None):
    args = parse_args(argv)
    digits = load_digits()
    val = split_indices(digits.target, args.val_fraction, args.seed)
    counts = {'train': 0, 'val': 0}
    per_class = {}
    order = np.random.default_rng(args.seed).permutation(len(digits.target))
    for index in order:
        pixels, digit = digits.images[index], digits.target[index]
        split = 'val' if index in val else 'train'
        label = class_folder(args.task, digit)
        if split == 'train' and args.train_per_class is not None:
            per_class[label] = per_class.get(label, 0) + 1
            if per_class[label] > args.train_per_class:
                continue
        folder = os.path.join(args.out, split, label)
        os.makedirs(folder, exist_ok=True)
        to_image(pixels, args.size).save(os.path.join(folder, f'{index:04d}.jpg'), quality=95)
        counts[split] += 1
    names = {'even': 'even digit', 'odd': 'odd digit'} if args.task == 'parity' else \
        {f'digit_{d}': name for d, name in enumerate(NAMES)}
    with open(os.path.join(args.out, 'names.txt'), 'w') as f:
        f.writelines(f'{folder}\t{name}\n' for folder, name in names.items())
    print(f'Wrote {counts["train"]} training and {counts["val"]} validation images to {args.out}',
          file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
