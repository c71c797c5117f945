#!/usr/bin/env python3
"""Convert an ImageNet-style folder tree into the RecordIO files the recipe trains on.

    python scripts/prepare_dataset.py SRC OUT [--splits train,val] [--seed 100] [--workers N]
                                              [--quality 95] [--names NAMES.txt]
    python scripts/prepare_dataset.py SRC OUT --val-fraction 0.2 [...]     # SRC/<class>/<image>, no split yet
    python scripts/prepare_dataset.py SRC OUT --splits train [...]         # SRC/<class>/<image>, all for training

SRC/<split>/<class>/<image> becomes, for each split, OUT/<split>.lst, OUT/<split>.rec and OUT/<split>.idx,
plus OUT/classes.json:

    {"classes": [{"index": 0, "folder": "n01440764", "name": "tench, Tinca tinca"}, ...]}

so that prediction can name the classes of any dataset. `--names` is a text file of `folder<TAB>name`
lines (e.g. ImageNet's synset mapping); without it a class's name is its folder name.

* With --val-fraction F, SRC holds the class folders directly and has no split: of each class's readable
  images, round(F x count) (at least 1, and at least 1 left for training, when the class has 2 or more) are
  drawn for OUT/val.* with --seed, the rest go to OUT/train.*; the .lst files say which file went where.
* A training set alone (train with --mode train): --splits train on SRC/<class>/<image> (SRC has no train/
  folder) writes OUT/train.* from every readable image, and so does --val-fraction 0; OUT/val.* of an earlier
  conversion is left alone and warned about.
* Labels are the index of the class folder in sorted order, taken from the first split (normally train);
  the other splits must use the same folders. An empty class folder keeps its index and is reported.
* Every file is decoded once (Pillow) before anything is written: unreadable and non-image files are
  reported (on stderr and in OUT/<split>_skipped.txt, with the reason) and never written.
* JPEG bytes are stored unchanged (like im2rec.py --pass-through); other formats (PNG, BMP, GIF, ...) are
  re-encoded to JPEG at --quality.
* Byte-compatible with MXNet's tools/im2rec.py (inside the mxnet wheel): the same .lst format (index, float
  label, relative path, tab-separated), record headers (flag 0, label, id = list index, 0), .idx lines
  (key, byte offset), and the same order: files listed as os.walk with sorted names, numbered in that
  order, then shuffled with Python's random.seed(--seed) like im2rec's fixed seed 100. On a tree of
  readable JPEGs in non-empty class folders both tools write identical files. Differences, on purpose: an
  empty class keeps its index (im2rec renumbers the classes after it); unreadable files are skipped
  instead of written; non-JPEG images are re-encoded.
* Parallel over --workers processes; outputs are written under temporary names and renamed at the end, so an
  interrupted run never leaves a .rec beside a stale .idx.
"""
import argparse
import collections
import io
import multiprocessing
import os
import random
import sys

# Run from anywhere: the repository holds rn50/files.py (atomic writes).
import bootstrap
bootstrap.start()   # the repository importable, .venv: before any third-party import

import mxnet as mx  # noqa: E402
import tqdm  # noqa: E402
from PIL import Image  # noqa: E402

from rn50 import flags  # noqa: E402
from rn50 import files  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=flags.HelpFormatter)
    parser.add_argument('src', help='folder with one sub-folder per split, each with one folder per class')
    parser.add_argument('out', help='output folder')
    parser.add_argument('--splits', default=None, help='comma-separated split folders to convert (default: train,val)')
    parser.add_argument('--val-fraction', type=flags.real(minimum=0, maximum=1), default=None,
                        help='SRC has no split folders, only class folders: hold out this fraction of each '
                             'class\'s images (drawn with --seed) as the validation split; 0: none, every image '
                             'for training (as --splits train)')
    parser.add_argument('--seed', type=int, default=100, help='shuffle seed (im2rec.py uses 100)')
    parser.add_argument('--workers', type=int, default=os.cpu_count(), help='parallel processes')
    parser.add_argument('--quality', type=int, default=95, help='JPEG quality for re-encoded images')
    parser.add_argument('--names', help='text file of "folder<TAB>human-readable name" lines')
    return parser.parse_args(argv)


def list_classes(split_dir):
    return sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d)))


def list_files(split_dir, classes):
    """(relative path, label) of every file under each class folder, in os.walk order with sorted names."""
    items = []
    for label, name in enumerate(classes):
        for path, dirs, files in os.walk(os.path.join(split_dir, name), followlinks=True):
            dirs.sort()
            for fname in sorted(files):
                items.append((os.path.relpath(os.path.join(path, fname), split_dir), label))
    return items


def check_image(path):
    """(None, needs re-encoding) if Pillow decodes the file fully, else (reason, None)."""
    try:
        with Image.open(path) as image:
            image.load()
            return None, image.format != 'JPEG'
    except Exception as e:  # Pillow raises many types for bad files; each is a reason to skip
        return f'{type(e).__name__}: {e}', None


def image_bytes(job):
    """The bytes to store: the file itself for a JPEG, a JPEG re-encoding otherwise."""
    path, reencode, quality = job
    if not reencode:
        with open(path, 'rb') as f:
            return f.read()
    with Image.open(path) as image:
        buffer = io.BytesIO()
        image.convert('RGB').save(buffer, format='JPEG', quality=quality)
        return buffer.getvalue()


def progress(iterable, stage, total):
    """`iterable`, with its progress on stderr: a tqdm bar on a terminal; elsewhere (a log file, a pipe) a line
    at every tenth, so a conversion of 1.28 M images shows it is alive. Consume it to its end (the bar
    reaches 100% when the iterable is exhausted)."""
    if sys.stderr.isatty():
        yield from tqdm.tqdm(iterable, total=total, desc=f'  {stage}', unit='file')
        return
    every = max(1, total // 10)
    for done, item in enumerate(iterable, 1):
        yield item
        if done % every == 0 or done == total:
            print(f'  {stage}: {done}/{total} files ({100 * done // max(total, 1)}%)', file=sys.stderr, flush=True)


def check_files(split_dir, items, pool):
    """(readable items as (path, label, needs re-encoding), skipped items as (path, reason))."""
    checks = list(progress(pool.imap(check_image, [os.path.join(split_dir, p) for p, _ in items], chunksize=64),
                           'decoded', len(items)))
    skipped = [(path, reason) for (path, _), (reason, _) in zip(items, checks) if reason]
    good = [(path, label, reencode) for (path, label), (reason, reencode) in zip(items, checks) if not reason]
    return good, skipped


def held_out(good, fraction, seed):
    """The positions in `good` of the validation images: round(fraction x count) of each class (at least 1,
    and at least 1 left for training, when the class has 2 or more), drawn with `seed`."""
    by_class = {}
    for position, (_, label, _) in enumerate(good):
        by_class.setdefault(label, []).append(position)
    draw = random.Random(seed)
    chosen = set()
    for label in sorted(by_class):
        positions = by_class[label]
        count = min(max(round(fraction * len(positions)), 1), len(positions) - 1)
        chosen.update(draw.sample(positions, count))
    return chosen


def convert_tree(args, splits, layout, pool):
    """Convert SRC/<split>/<class>/<image> for each split; with --val-fraction, SRC/<class>/<image> into a
    drawn train and val split (`layout`: check_layout's). Returns nothing; prints what was written."""
    class_root, classes, val_fraction = layout
    if val_fraction is None:
        for split in splits:
            split_dir = os.path.join(args.src, split)
            items = list_files(split_dir, classes)
            print(f'{split}: {len(items)} files in {len(classes)} classes', file=sys.stderr)
            convert_split(args, split, split_dir, classes, *check_files(split_dir, items, pool), pool)
        return
    items = list_files(class_root, classes)
    if val_fraction == 0:
        print(f'{class_root}: {len(items)} files in {len(classes)} classes, all for training (no validation '
              'split: train with --mode train)', file=sys.stderr)
        stale = os.path.join(args.out, 'val.rec')
        if os.path.exists(stale):
            print(f'  warning: {stale} (and val.idx) is from an earlier conversion and stays: --mode train_val would '
                  'validate on it; delete it if those images are now training images', file=sys.stderr)
    else:
        print(f'{class_root}: {len(items)} files in {len(classes)} classes, {val_fraction:g} of each class '
              'held out for validation', file=sys.stderr)
    good, skipped = check_files(class_root, items, pool)
    val = held_out(good, val_fraction, args.seed) if val_fraction else set()
    parts = {'train': [item for i, item in enumerate(good) if i not in val],
             'val': [item for i, item in enumerate(good) if i in val]}
    for split in ('train', 'val') if val_fraction else ('train',):
        convert_split(args, split, class_root, classes, parts[split], skipped if split == 'train' else [],
                      pool)


def convert_split(args, split, split_dir, classes, good, skipped, pool):
    """Write OUT/<split>.{lst,rec,idx} of the readable `good` items and OUT/<split>_skipped.txt."""
    report_problems(args, split, classes, skipped, good)
    # Number in listing order, then shuffle: the order im2rec.py produces.
    numbered = [(index, path, label, reencode) for index, (path, label, reencode) in enumerate(good)]
    random.seed(args.seed)
    random.shuffle(numbered)
    write_split(args, split, split_dir, numbered, pool)
    print(f'{split}: wrote {len(numbered)} records, skipped {len(skipped)} files', file=sys.stderr)


def report_problems(args, split, classes, skipped, good):
    with files.atomic_path(os.path.join(args.out, f'{split}_skipped.txt')) as tmp, open(tmp, 'w') as f:
        for path, reason in skipped:
            f.write(f'{path}\t{reason}\n')
            print(f'  skipped {path}: {reason}', file=sys.stderr)
    present = {label for _, label, _ in good}
    for label, name in enumerate(classes):
        if label not in present:
            print(f'  warning: class {name} (label {label}) of {split} has no readable image', file=sys.stderr)


def write_split(args, split, split_dir, numbered, pool):
    out = {ext: os.path.join(args.out, f'{split}.{ext}') for ext in ('lst', 'rec', 'idx')}
    with files.atomic_path(out['lst']) as lst_tmp, files.atomic_path(out['rec']) as rec_tmp, \
            files.atomic_path(out['idx']) as idx_tmp:
        with open(lst_tmp, 'w') as f:
            for index, path, label, _ in numbered:
                f.write(f'{index}\t{float(label):f}\t{path}\n')
        writer = mx.recordio.MXIndexedRecordIO(idx_tmp, rec_tmp, 'w')
        jobs = [(os.path.join(split_dir, path), reencode, args.quality) for _, path, _, reencode in numbered]
        payloads = progress(pool.imap(image_bytes, jobs, chunksize=16), 'written', len(numbered))
        for payload, (index, _, label, _) in zip(payloads, numbered):   # payloads first: its bar ends at 100%
            header = mx.recordio.IRHeader(0, float(label), index, 0)
            writer.write_idx(index, mx.recordio.pack(header, payload))
        writer.close()


def read_names(path):
    names = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                folder, _, name = line.rstrip('\n').partition('\t')
                names[folder] = name or folder
    return names


SPLIT_NAMES = ('train', 'val')


# What check_layout finds: the folder whose subfolders are the classes, the classes, and the fraction of each held
# out for validation (None: the splits are folders of SRC; 0: every image for training).
Layout = collections.namedtuple('Layout', 'class_root classes val_fraction')


def check_layout(args, splits):
    """(what is wrong with SRC's layout for these flags, or None; the Layout found). With --val-fraction, SRC
    holding only train/ (or only val/) is the split layout with a half missing: its class folders are the
    classes (they used to become one class named `train`, which scored 100%). --splits train on class folders
    (no train/) takes them all for training, as --val-fraction 0 does (the Layout's val_fraction is 0)."""
    class_root, val_fraction = None, args.val_fraction
    folders = list_classes(args.src) if os.path.isdir(args.src) else []
    lone_split = folders and set(folders) <= set(SPLIT_NAMES) and len(folders) == 1 and \
        list_classes(os.path.join(args.src, folders[0]))
    if args.val_fraction is not None:
        if set(folders) == set(SPLIT_NAMES):
            return (f'{args.src} is split already (train/ and val/): leave --val-fraction out'), None
        class_root = os.path.join(args.src, folders[0]) if lone_split else args.src
        if lone_split:
            print(f'{args.src} holds only {folders[0]}/: its class folders are ' + (
                f'split, {val_fraction:g} of each held out for validation' if val_fraction else
                'the classes'), file=sys.stderr)
    elif splits == ['train'] and folders and not set(folders) & set(SPLIT_NAMES):
        print(f'--splits train: {args.src} has no train/ folder, so its {len(folders)} folders are the classes and '
              'every image goes to train.*', file=sys.stderr)
        class_root, val_fraction = args.src, 0.0
    else:
        for split in splits:
            if os.path.isdir(os.path.join(args.src, split)):
                continue
            if lone_split:
                return (f'{args.src} has {folders[0]}/ but no {split}/: hold out part of {folders[0]}/ for '
                        f'validation with --val-fraction 0.2, or convert {folders[0]}/ alone with --splits '
                        f'{folders[0]} (then train with --mode train)'), None
            return (f'{os.path.join(args.src, split)} is not a folder (expected SRC/<split>/<class>/<image>; for '
                    'SRC/<class>/<image>, without a split, add --val-fraction 0.2 to hold out 20% for validation, '
                    'or convert every image for training with --splits train)'), None
        class_root = os.path.join(args.src, splits[0])
    layout = Layout(class_root, list_classes(class_root) if os.path.isdir(class_root) else [], val_fraction)
    if not layout.classes:
        return f'{class_root} has no class folders', layout
    if len(layout.classes) < 2:
        return (f'{class_root} has one class folder ({layout.classes[0]}): a classifier needs at least 2 '
                '(nothing can be learned from one class: every answer would be right)'), layout
    for split in splits[1:] if val_fraction is None else []:
        unknown = sorted(set(list_classes(os.path.join(args.src, split))) - set(layout.classes))
        if unknown:
            return f'{split} has class folders that {splits[0]} lacks: {", ".join(unknown[:5])}', layout
    return None, layout


def main(argv=None):
    args = parse_args(argv)
    same = args.val_fraction == 0 and args.splits == 'train'   # both say: every image for training
    if args.val_fraction is not None and args.splits is not None and not same:
        print('error: --val-fraction splits a folder of class folders itself: leave --splits out', file=sys.stderr)
        return 2
    splits = [s for s in (args.splits or 'train,val').split(',') if s]
    problem, layout = check_layout(args, splits)
    if problem:
        print(f'error: {problem}', file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    names = read_names(args.names) if args.names else {}
    with multiprocessing.Pool(max(1, args.workers)) as pool:
        convert_tree(args, splits, layout, pool)
    files.write_json(os.path.join(args.out, 'classes.json'),
                    {'classes': [{'index': i, 'folder': c, 'name': names.get(c, c)}
                                 for i, c in enumerate(layout.classes)]})
    print(f'Dataset written to {args.out}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
