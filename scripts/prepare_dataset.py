#!/usr/bin/env python3
"""Convert an ImageNet-style folder tree into the RecordIO files the recipe trains on.

    python scripts/prepare_dataset.py SRC OUT [--splits train,val] [--seed 100] [--workers N]
                                              [--quality 95] [--names NAMES.txt]
                                              [--drop-duplicates] [--duplicate-distance 2]
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
* Leakage: an image of a held-out split (val; every split after the first) that is a copy of a training image
  (the first split's) inflates validation accuracy. Each is reported, naming both files, on stderr and in
  OUT/duplicates.txt: identical bytes (SHA-256), or the same picture resized or re-encoded (64-bit perceptual
  hashes, imagehash.phash, at most --duplicate-distance bits apart). Both hashes are computed where the file is
  decoded anyway. --drop-duplicates leaves those copies out of the held-out split (the training copies stay).
  Copies within one split are not leakage and are left alone.
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
import hashlib
import io
import multiprocessing
import os
import random
import sys

# Run from anywhere: the repository holds rn50/files.py (atomic writes).
import bootstrap
bootstrap.start()   # the repository importable, .venv: before any third-party import

import imagehash  # noqa: E402
import numpy as np  # noqa: E402
import tqdm  # noqa: E402
from PIL import Image  # noqa: E402

from rn50 import flags  # noqa: E402
from rn50 import files  # noqa: E402
from rn50.data import records  # noqa: E402


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
    parser.add_argument('--drop-duplicates', action='store_true',
                        help='leave out of val (every split after the first) the images that are copies of training '
                             'images: identical bytes or the same picture (--duplicate-distance); they are reported '
                             'either way, in OUT/duplicates.txt')
    parser.add_argument('--duplicate-distance', type=flags.integer(minimum=0, maximum=MAX_DISTANCE), default=2,
                        help='two pictures are the same when their 64-bit perceptual hashes differ in at most this '
                             'many bits (a resized or re-encoded photo: 0 or 2; 4 also finds other hands\' digits '
                             'of a low-detail set); 0: identical hashes only')
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


# A readable image as check_files finds it: its path (relative to its split's folder), label, whether it needs
# re-encoding (not a JPEG), the SHA-256 of its file and its 64-bit perceptual hash (both for find_leakage).
Checked = collections.namedtuple('Checked', 'path label reencode sha256 phash')


def check_image(path):
    """(None, (needs re-encoding, SHA-256 of the file, 64-bit perceptual hash as an int)) if Pillow decodes the
    file fully, else (reason, None). The hashes find copies across splits; they are computed here, from the bytes
    read and the image decoded for the check, so that finding them costs no second pass over the dataset."""
    try:
        with open(path, 'rb') as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return None, (image.format != 'JPEG', hashlib.sha256(data).digest(), perceptual_hash(image))
    except Exception as e:  # Pillow raises many types for bad files; each is a reason to skip
        return f'{type(e).__name__}: {e}', None


# The side of the grey square imagehash.phash takes its DCT of (hash_size 8 x highfreq_factor 4).
PHASH_INPUT = 32


def perceptual_hash(image):
    """imagehash.phash of `image` (64 bits, as an int), its first step (grey, LANCZOS down to 32x32) done with
    Pillow's reducing_gap=3 shortcut: 1.2 instead of 2.7 ms for a 500x375 photo, and resized or re-encoded copies
    stay as close (docs/data.md#leakage)."""
    small = image.convert('L').resize((PHASH_INPUT, PHASH_INPUT), Image.LANCZOS, reducing_gap=3.0)
    return int(str(imagehash.phash(small)), 16)


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
    """(readable items as Checked, skipped items as (path, reason))."""
    checks = list(progress(pool.imap(check_image, [os.path.join(split_dir, p) for p, _ in items], chunksize=64),
                           'decoded', len(items)))
    skipped = [(path, reason) for (path, _), (reason, _) in zip(items, checks) if reason]
    good = [Checked(path, label, *found) for (path, label), (reason, found) in zip(items, checks) if not reason]
    return good, skipped


def held_out(good, fraction, seed):
    """The positions in `good` of the validation images: round(fraction x count) of each class (at least 1,
    and at least 1 left for training, when the class has 2 or more), drawn with `seed`."""
    by_class = {}
    for position, item in enumerate(good):
        by_class.setdefault(item.label, []).append(position)
    draw = random.Random(seed)
    chosen = set()
    for label in sorted(by_class):
        positions = by_class[label]
        count = min(max(round(fraction * len(positions)), 1), len(positions) - 1)
        chosen.update(draw.sample(positions, count))
    return chosen


def convert_tree(args, splits, layout, pool):
    """Convert SRC/<split>/<class>/<image> for each split; with --val-fraction, SRC/<class>/<image> into a
    drawn train and val split (`layout`: check_layout's). Every split is decoded and hashed first, then the
    copies of training images in the other splits are reported (and left out with --drop-duplicates), then the
    splits are written. Returns find_leakage's copies; prints what was written."""
    class_root, classes, val_fraction = layout
    parts, skipped, roots = {}, {}, {}
    if val_fraction is None:
        for split in splits:
            roots[split] = os.path.join(args.src, split)
            items = list_files(roots[split], classes)
            print(f'{split}: {len(items)} files in {len(classes)} classes', file=sys.stderr)
            parts[split], skipped[split] = check_files(roots[split], items, pool)
    else:
        items = list_files(class_root, classes)
        if val_fraction == 0:
            print(f'{class_root}: {len(items)} files in {len(classes)} classes, all for training (no validation '
                  'split: train with --mode train)', file=sys.stderr)
            stale = os.path.join(args.out, 'val.rec')
            if os.path.exists(stale):
                print(f'  warning: {stale} (and val.idx) is from an earlier conversion and stays: --mode train_val '
                      'would validate on it; delete it if those images are now training images', file=sys.stderr)
        else:
            print(f'{class_root}: {len(items)} files in {len(classes)} classes, {val_fraction:g} of each class '
                  'held out for validation', file=sys.stderr)
        good, skipped['train'] = check_files(class_root, items, pool)
        val = held_out(good, val_fraction, args.seed) if val_fraction else set()
        parts['train'] = [item for i, item in enumerate(good) if i not in val]
        if val_fraction:
            parts['val'], skipped['val'] = [item for i, item in enumerate(good) if i in val], []
        roots = dict.fromkeys(parts, class_root)
    copies = find_leakage(args, parts, roots)
    for split, good in parts.items():
        if args.drop_duplicates and copies.get(split):
            good = [item for position, item in enumerate(good) if position not in copies[split]]
        convert_split(args, split, roots[split], classes, good, skipped[split], pool)
    return copies


# ---- leakage: copies of training images in the other splits ----------------------------------------------------

# --duplicate-distance's largest value. A distance d searches d + 1 bands of 64 / (d + 1) bits (find_copies): the
# larger it is, the narrower the bands and the more training images share a band value (random hashes of ImageNet's
# 1.28 M: 160 a value of a 13-bit band at 4, 10,000 of a 7-bit one at 8, crowded). Copies resized or re-encoded
# are within 4 bits.
MAX_DISTANCE = 8
# A band value that more than this many training images share is not searched for near copies (find_copies): such
# values are those of flat or nearly blank pictures, and searching them would compare every held-out image of that
# kind with every training one (quadratic). Identical hashes are still found, whatever their count.
CROWDED = 2000


def hamming(a, b):
    """The number of bits in which two uint64 arrays differ, element by element (numpy 1.23 has no bitwise_count:
    the usual shift-and-add popcount, in place)."""
    x = a ^ b
    x -= (x >> np.uint64(1)) & np.uint64(0x5555555555555555)
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x += x >> np.uint64(4)
    x &= np.uint64(0x0F0F0F0F0F0F0F0F)
    x *= np.uint64(0x0101010101010101)
    x >>= np.uint64(56)
    return x.astype(np.uint8)


def find_copies(queries, references, distance, crowded=CROWDED, chunk=1 << 22):
    """The nearest reference of each query within `distance` bits (uint64 perceptual hashes): (query positions,
    reference positions, distances), sorted by query, a tie going to the first reference; and the number of the
    queries left unmatched that skipped a crowded band. Pigeonhole: two hashes at most `distance` bits apart agree
    exactly on at least one of distance + 1 bands of the 64 bits, so a query is compared only with the references
    that share one of its band values, found in the references sorted by that band (1.28 M references x 50 k queries
    in seconds). A band value that more than `crowded` references share is not searched (flat pictures: linear
    instead of quadratic); identical hashes are matched first, whatever their count, so a blank copy of a blank
    picture is still found. At most `chunk` candidate pairs (plus one bucket) are in memory at a time."""
    queries, references = np.asarray(queries, np.uint64), np.asarray(references, np.uint64)
    order = np.argsort(references, kind='stable')
    ranked = references[order]
    at = np.searchsorted(ranked, queries)
    same = np.flatnonzero(at < len(ranked))
    same = same[ranked[at[same]] == queries[same]]
    found = [(same, order[at[same]], np.zeros(len(same), np.uint8))]
    skipped = np.zeros(len(queries), bool)
    edges = [64 * band // (distance + 1) for band in range(distance + 2)]
    for low, high in zip(edges, edges[1:]) if distance else ():
        shift, mask = np.uint64(low), np.uint64((1 << (high - low)) - 1)
        order = np.argsort((references >> shift) & mask, kind='stable')
        ranked = references[order]
        keys, wanted = (ranked >> shift) & mask, (queries >> shift) & mask
        starts = np.searchsorted(keys, wanted, 'left')
        counts = np.searchsorted(keys, wanted, 'right') - starts
        skipped |= counts > crowded
        counts[counts > crowded] = 0
        before = np.cumsum(counts) - counts     # the candidate pairs of the queries before each
        begin = 0
        while begin < len(queries):
            end = max(int(np.searchsorted(before, before[begin] + chunk, 'right')), begin + 1)
            query = np.repeat(np.arange(begin, end), counts[begin:end])
            at = starts[query] + np.arange(len(query)) - np.repeat(before[begin:end] - before[begin], counts[begin:end])
            distances = hamming(queries[query], ranked[at])
            near = distances <= distance
            found.append((query[near], order[at[near]], distances[near]))
            begin = end
    query, reference, distances = (np.concatenate(column) for column in zip(*found))
    best = np.lexsort((reference, distances, query))
    query, reference, distances = query[best], reference[best], distances[best]
    first = np.r_[True, query[1:] != query[:-1]] if len(query) else np.zeros(0, bool)
    skipped[query] = False
    return query[first], reference[first], distances[first], int(skipped.sum())


def match_split(held, training, distance):
    """The copies of `training` items (Checked) among the `held` ones: {held position: (training position,
    perceptual-hash distance, or None for identical bytes)}, one training file for each, the first with identical
    bytes, else the nearest picture; and the count of find_copies' crowded queries."""
    by_digest = {}
    for position, item in enumerate(held):
        by_digest.setdefault(item.sha256, []).append(position)
    copies = {}
    for reference, item in enumerate(training):
        for position in by_digest.pop(item.sha256, ()):
            copies[position] = (reference, None)
    rest = [position for position in range(len(held)) if position not in copies]
    query, reference, distances, crowded = find_copies(
        np.fromiter((held[position].phash for position in rest), np.uint64, len(rest)),
        np.fromiter((item.phash for item in training), np.uint64, len(training)), distance)
    for q, r, d in zip(query.tolist(), reference.tolist(), distances.tolist()):
        copies[rest[q]] = (r, d)
    return dict(sorted(copies.items())), crowded


def find_leakage(args, parts, roots, shown=5):
    """Report the images of each held-out split (every split after the first: val) that are copies of a training
    image (the first split's), naming both files (relative to SRC): a line per split with the count and the first
    `shown` pairs on stderr, the whole list in OUT/duplicates.txt (kind, distance, the held-out file, the training
    file; a header alone when there are none). Returns {held-out split: positions of its copies}, what
    --drop-duplicates leaves out. With one split there is nothing to compare and no file."""
    train, *others = parts
    if not others:
        return {}
    copies, rows = {}, []
    for split in others:
        found, crowded = match_split(parts[split], parts[train], args.duplicate_distance)
        copies[split] = set(found)
        near = sum(distance is not None for _, distance in found.values())
        if not found:
            print(f'leakage: none of the {len(parts[split])} {split} images is a copy of a {train} image (identical '
                  f'bytes, or perceptual hashes at most {args.duplicate_distance} bits apart)', file=sys.stderr)
        else:
            print(f'leakage: {len(found)} of the {len(parts[split])} {split} images are copies of {train} images '
                  f'({len(found) - near} identical bytes, {near} the same picture), all in '
                  f'{os.path.join(args.out, "duplicates.txt")}:', file=sys.stderr)
        for count, (position, (reference, distance)) in enumerate(found.items()):
            names = [os.path.relpath(os.path.join(roots[part], item.path), args.src)
                     for part, item in ((split, parts[split][position]), (train, parts[train][reference]))]
            kind = 'identical bytes' if distance is None else 'same picture'
            rows.append(f'{kind}\t{distance or 0}\t{names[0]}\t{names[1]}\n')
            if count < shown:
                what = kind if distance is None else f'{kind}, hash distance {distance}'
                print(f'  {names[0]} <-> {names[1]}: {what}', file=sys.stderr)
        if len(found) > shown:
            print(f'  ... and {len(found) - shown} more', file=sys.stderr)
        if crowded:
            print(f'  note: {crowded} {split} images share a perceptual-hash band with more than {CROWDED} {train} '
                  'images (flat or nearly blank pictures): that band was searched for identical hashes only',
                  file=sys.stderr)
    with files.atomic_path(os.path.join(args.out, 'duplicates.txt')) as tmp, open(tmp, 'w') as f:
        f.write(f'kind\tdistance\t{" or ".join(others)} file\t{train} file\n')
        f.writelines(rows)
    if rows and args.drop_duplicates:
        print(f'--drop-duplicates: those copies are left out of {", ".join(others)}; the {train} files stay',
              file=sys.stderr)
    return copies


def convert_split(args, split, split_dir, classes, good, skipped, pool):
    """Write OUT/<split>.{lst,rec,idx} of the readable `good` items and OUT/<split>_skipped.txt."""
    report_problems(args, split, classes, skipped, good)
    # Number in listing order, then shuffle: the order im2rec.py produces.
    numbered = [(index, item.path, item.label, item.reencode) for index, item in enumerate(good)]
    random.seed(args.seed)
    random.shuffle(numbered)
    write_split(args, split, split_dir, numbered, pool)
    print(f'{split}: wrote {len(numbered)} records, skipped {len(skipped)} files', file=sys.stderr)


def report_problems(args, split, classes, skipped, good):
    with files.atomic_path(os.path.join(args.out, f'{split}_skipped.txt')) as tmp, open(tmp, 'w') as f:
        for path, reason in skipped:
            f.write(f'{path}\t{reason}\n')
            print(f'  skipped {path}: {reason}', file=sys.stderr)
    present = {item.label for item in good}
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
        jobs = [(os.path.join(split_dir, path), reencode, args.quality) for _, path, _, reencode in numbered]
        payloads = progress(pool.imap(image_bytes, jobs, chunksize=16), 'written', len(numbered))
        with records.RecordWriter(rec_tmp, idx_tmp) as writer:
            for payload, (index, _, label, _) in zip(payloads, numbered):   # payloads first: its bar ends at 100%
                writer.write(index, float(label), payload)


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
        copies = convert_tree(args, splits, layout, pool)
    files.write_json(os.path.join(args.out, 'classes.json'),
                    {'classes': [{'index': i, 'folder': c, 'name': names.get(c, c)}
                                 for i, c in enumerate(layout.classes)]})
    print(f'Dataset written to {args.out}', file=sys.stderr)
    leaked = {split: len(found) for split, found in copies.items() if found}
    if leaked and not args.drop_duplicates:
        print(f'hint: {" and ".join(f"{count} {split}" for split, count in leaked.items())} images are copies of '
              f'training images ({os.path.join(args.out, "duplicates.txt")}), which inflates validation accuracy: '
              'rerun with --drop-duplicates to leave them out (the training copies stay)', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
