#!/usr/bin/env python
"""Write the demo dataset: real images that need no network, as an ImageNet-style folder tree.

    python scripts/make_demo_dataset.py OUT [--size 32] [--val-fraction 0.2] [--seed 0]

The UCI handwritten digits that scikit-learn ships (1,797 grey 8x8 images, 10 classes) are upscaled
(bicubic) to --size pixels square and saved as RGB JPEGs (quality 95) in OUT/train/digit_<d>/<n>.jpg and
OUT/val/digit_<d>/<n>.jpg, split per class (stratified) with the fixed seed. OUT/names.txt names the classes
for scripts/prepare_dataset.py --names. Re-running with the same arguments writes identical files.
"""
import argparse
import os
import sys

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

NAMES = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine']


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out', help='output folder')
    parser.add_argument('--size', type=int, default=32, help='side of the square images in pixels')
    parser.add_argument('--val-fraction', type=float, default=0.2, help='share of each class for validation')
    parser.add_argument('--seed', type=int, default=0, help='seed of the train/val split')
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


def main(argv=None):
    args = parse_args(argv)
    digits = load_digits()
    val = split_indices(digits.target, args.val_fraction, args.seed)
    counts = {'train': 0, 'val': 0}
    for index, (pixels, digit) in enumerate(zip(digits.images, digits.target)):
        split = 'val' if index in val else 'train'
        folder = os.path.join(args.out, split, f'digit_{digit}')
        os.makedirs(folder, exist_ok=True)
        to_image(pixels, args.size).save(os.path.join(folder, f'{index:04d}.jpg'), quality=95)
        counts[split] += 1
    with open(os.path.join(args.out, 'names.txt'), 'w') as f:
        f.writelines(f'digit_{d}\t{name}\n' for d, name in enumerate(NAMES))
    print(f'Wrote {counts["train"]} training and {counts["val"]} validation images to {args.out}',
          file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
