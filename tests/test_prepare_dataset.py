"""scripts/prepare_dataset.py and scripts/make_demo_dataset.py on real images; the matching of its leakage check
at scale, in process."""
import json
import os
import shutil
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from conftest import ROOT, run_script

# A tier per test: the tests run the scripts as programs (integration), except the leakage matching's scale test,
# in process (unit).

IM2REC = os.path.join(os.path.dirname(mx.__file__), 'tools', 'im2rec.py')


def write_jpeg(path, seed, size=(40, 30)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format='JPEG', quality=90)


def read_records(out, split):
    reader = mx.recordio.MXIndexedRecordIO(str(out / f'{split}.idx'), str(out / f'{split}.rec'), 'r')
    records = []
    for key in reader.keys:
        header, payload = mx.recordio.unpack(reader.read_idx(key))
        records.append((key, header, payload))
    reader.close()
    return records


@pytest.fixture
def tree(tmp_path):
    """train/{cat,dog,empty}/ and val/{cat,dog}/ with JPEGs, a PNG, a corrupt JPEG and a text file."""
    src = tmp_path / 'src'
    for split, count in (('train', 6), ('val', 2)):
        for c, name in enumerate(('cat', 'dog')):
            for i in range(count):
                write_jpeg(str(src / split / name / f'{i}.jpg'), seed=100 * c + i + (0 if split == 'train' else 50))
    os.makedirs(src / 'train' / 'empty')
    Image.fromarray(np.full((20, 20, 3), 200, np.uint8)).save(src / 'train' / 'dog' / 'drawing.png')
    good = (src / 'train' / 'cat' / '0.jpg').read_bytes()
    (src / 'train' / 'cat' / 'broken.jpg').write_bytes(good[:len(good) // 3])
    (src / 'train' / 'dog' / 'notes.txt').write_text('not an image')
    return src


@pytest.mark.integration
def test_labels_bytes_report_and_classes(tree, tmp_path):
    out = tmp_path / 'out'
    result = run_script('scripts/prepare_dataset.py', tree, out, '--workers', '2')
    records = read_records(out, 'train')
    assert len(records) == 6 + 6 + 1                    # 12 JPEGs + the PNG; broken and text skipped
    assert '  written: 13/13 files (100%)' in result.stderr      # progress in a pipe too, to the end
    lst = [line.split('\t') for line in (out / 'train.lst').read_text().splitlines()]
    for (key, header, payload), (index, label, path) in zip(records, lst):
        assert key == int(index) == header.id and header.flag == 0
        assert header.label == float(label) == {'cat': 0, 'dog': 1}[path.strip().split('/')[0]]
        source = (tree / 'train' / path.strip()).read_bytes()
        if path.strip().endswith('.jpg'):
            assert payload == source                    # JPEG bytes stored unchanged
        else:
            assert payload[:2] == b'\xff\xd8'           # the PNG became a JPEG
            assert Image.open(__import__('io').BytesIO(payload)).format == 'JPEG'
    skipped = (out / 'train_skipped.txt').read_text()
    assert 'cat/broken.jpg' in skipped and 'dog/notes.txt' in skipped
    assert 'broken.jpg' in result.stderr and 'notes.txt' in result.stderr
    assert 'class empty (label 2)' in result.stderr     # reported, and keeps its index
    classes = json.loads((out / 'classes.json').read_text())['classes']
    assert [(c['index'], c['folder']) for c in classes] == [(0, 'cat'), (1, 'dog'), (2, 'empty')]
    assert len(read_records(out, 'val')) == 4
    assert 'leakage: none of the 4 val images is a copy of a train image' in result.stderr
    assert (out / 'duplicates.txt').read_text() == 'kind\tdistance\tval file\ttrain file\n'


@pytest.mark.integration
def test_names_file_and_seeded_order(tree, tmp_path):
    names = tmp_path / 'names.txt'
    names.write_text('cat\tdomestic cat\ndog\tdog, domestic dog\n')
    run_script('scripts/prepare_dataset.py', tree, tmp_path / 'a', '--names', names, '--seed', '7')
    run_script('scripts/prepare_dataset.py', tree, tmp_path / 'b', '--names', names, '--seed', '7')
    run_script('scripts/prepare_dataset.py', tree, tmp_path / 'c', '--seed', '8')
    assert (tmp_path / 'a' / 'train.rec').read_bytes() == (tmp_path / 'b' / 'train.rec').read_bytes()
    assert (tmp_path / 'a' / 'train.lst').read_text() != (tmp_path / 'c' / 'train.lst').read_text()
    classes = json.loads((tmp_path / 'a' / 'classes.json').read_text())['classes']
    assert [c['name'] for c in classes] == ['domestic cat', 'dog, domestic dog', 'empty']


@pytest.mark.integration
def test_missing_split_is_a_clear_error(tmp_path):
    result = run_script('scripts/prepare_dataset.py', tmp_path / 'nowhere', tmp_path / 'out', check=False)
    assert result.returncode == 2 and 'is not a folder' in result.stderr


@pytest.mark.integration
def test_a_folder_without_a_split_is_split_per_class(tree, tmp_path):
    """--val-fraction: SRC/<class>/<image> (here tree/train) becomes a train and a val split, a fraction of each
    class held out, every readable image in exactly one of them, the same draw for the same seed."""
    out, again = tmp_path / 'out', tmp_path / 'again'
    run_script('scripts/prepare_dataset.py', tree / 'train', out, '--val-fraction', '0.34', '--workers', '2')
    lst = {split: [line.split('\t')[2] for line in (out / f'{split}.lst').read_text().splitlines()]
           for split in ('train', 'val')}
    # cat: 6 readable (broken.jpg skipped) -> 2 held out; dog: 6 JPEGs + the PNG -> round(0.34 x 7) = 2
    assert sorted(p.split('/')[0] for p in lst['val']) == ['cat', 'cat', 'dog', 'dog']
    assert len(lst['train']) == 13 - 4 and not set(lst['train']) & set(lst['val'])
    assert [r[1].label for r in read_records(out, 'val')] == [{'cat': 0, 'dog': 1}[p.split('/')[0]] for p in lst['val']]
    assert json.loads((out / 'classes.json').read_text())['classes'][2]['folder'] == 'empty'
    assert 'broken.jpg' in (out / 'train_skipped.txt').read_text()
    run_script('scripts/prepare_dataset.py', tree / 'train', again, '--val-fraction', '0.34', '--workers', '1')
    assert (again / 'val.lst').read_text() == (out / 'val.lst').read_text()
    refused = run_script('scripts/prepare_dataset.py', tree / 'train', tmp_path / 'x', check=False)
    assert refused.returncode == 2 and 'add --val-fraction 0.2' in refused.stderr


@pytest.mark.integration
def test_byte_compatible_with_im2rec_both_ways(tmp_path):
    src = tmp_path / 'src'
    for c in range(3):
        for i in range(7):
            write_jpeg(str(src / 'train' / f'class{c}' / f'img{i}.jpg'), seed=10 * c + i)
    theirs = tmp_path / 'theirs'
    theirs.mkdir()
    run_script(IM2REC, '--list', '--recursive', theirs / 'train', src / 'train')
    run_script(IM2REC, '--pass-through', '--num-thread', '1', theirs / 'train', src / 'train')
    ours = tmp_path / 'ours'
    run_script('scripts/prepare_dataset.py', src, ours, '--splits', 'train')
    for ext in ('lst', 'idx', 'rec'):
        assert (ours / f'train.{ext}').read_bytes() == (theirs / f'train.{ext}').read_bytes(), ext
    # and MXNet's iterator reads what either tool wrote
    for folder in (ours, theirs):
        it = mx.io.ImageRecordIter(path_imgrec=str(folder / 'train.rec'), path_imgidx=str(folder / 'train.idx'),
                                   data_shape=(3, 24, 24), batch_size=7, resize=24, preprocess_threads=1)
        labels = np.concatenate([b.label[0].asnumpy() for b in it])
        assert sorted(labels.tolist()) == sorted([0.0] * 7 + [1.0] * 7 + [2.0] * 7)


@pytest.mark.integration
def test_dali_reads_the_records(tree, tmp_path):
    from nvidia.dali import Pipeline, fn
    out = tmp_path / 'out'
    run_script('scripts/prepare_dataset.py', tree, out)
    pipe = Pipeline(batch_size=13, num_threads=1, device_id=None, seed=1)
    with pipe:
        jpegs, labels = fn.readers.mxnet(path=[str(out / 'train.rec')], index_path=[str(out / 'train.idx')])
        pipe.set_outputs(fn.decoders.image(jpegs, device='cpu'), labels)
    pipe.build()
    images, labels = pipe.run()
    assert len(images) == 13 and sorted(np.asarray(labels.as_tensor()).ravel().tolist()) == [0.0] * 6 + [1.0] * 7


@pytest.mark.integration
def test_demo_dataset(tmp_path):
    run_script('scripts/make_demo_dataset.py', tmp_path / 'a', '--size', '24')
    run_script('scripts/make_demo_dataset.py', tmp_path / 'b', '--size', '24')
    files = {s: sorted((tmp_path / 'a' / s).rglob('*.jpg')) for s in ('train', 'val')}
    assert len(files['train']) + len(files['val']) == 1797
    assert len(files['val']) == 359                   # round(0.2 x per-class count), summed over the classes
    classes = sorted(p.name for p in (tmp_path / 'a' / 'train').iterdir())
    assert classes == [f'digit_{d}' for d in range(10)]
    for split in ('train', 'val'):
        per_class = [len(list((tmp_path / 'a' / split / c).iterdir())) for c in classes]
        assert min(per_class) > 0
    with Image.open(files['val'][0]) as image:
        assert image.format == 'JPEG' and image.size == (24, 24) and image.mode == 'RGB'
    assert all(p.read_bytes() == (tmp_path / 'b' / p.relative_to(tmp_path / 'a')).read_bytes()
               for p in files['train'][:50])
    assert (tmp_path / 'a' / 'names.txt').read_text().splitlines()[3] == 'digit_3\tthree'


@pytest.mark.integration
def test_a_lone_train_folder_is_split_by_its_class_folders(tree, tmp_path):
    """photos/train/<class>/ without val/: --val-fraction splits train/'s classes (it used to make one class
    named `train` that scored 100%); without it, one error line says what to run."""
    import shutil
    shutil.rmtree(tree / 'val')
    out = tmp_path / 'out'
    result = run_script('scripts/prepare_dataset.py', tree, out, '--val-fraction', '0.5', '--workers', '1')
    assert 'holds only train/' in result.stderr
    names = [c['folder'] for c in json.loads((out / 'classes.json').read_text())['classes']]
    assert names == ['cat', 'dog', 'empty']
    assert len(read_records(out, 'val')) == 3 + 4 and len(read_records(out, 'train')) == 3 + 3
    failed = run_script('scripts/prepare_dataset.py', tree, tmp_path / 'other', check=False)
    assert failed.returncode == 2 and failed.stderr.count('error:') == 1
    assert 'has train/ but no val/: hold out part of train/ for validation with --val-fraction 0.2' in failed.stderr
    assert not (tmp_path / 'other').exists()


@pytest.mark.integration
def test_one_class_is_refused_when_preparing_and_training(tmp_path, capsys):
    import train
    src = tmp_path / 'src'
    for i in range(4):
        write_jpeg(str(src / 'cat' / f'{i}.jpg'), seed=i)
    failed = run_script('scripts/prepare_dataset.py', src, tmp_path / 'out', '--val-fraction', '0.5', check=False)
    assert failed.returncode == 2 and 'has one class folder (cat): a classifier needs at least 2' in failed.stderr
    data = tmp_path / 'data'
    data.mkdir()
    (data / 'train.rec').write_bytes(b'')
    (data / 'classes.json').write_text(json.dumps({'classes': [{'index': 0, 'folder': 'cat', 'name': 'cat'}]}))
    with pytest.raises(SystemExit):
        train.parse_flags(['--data-train', str(data / 'train.rec')])
    assert 'names 1 class: nothing can be learned from one class' in capsys.readouterr().err


def picture(seed, size=(64, 48)):
    """A picture with structure, unlike noise: a two-colour gradient at an angle, an ellipse and a rectangle, all
    drawn from `seed` (distinct seeds: perceptual hashes 14 or more bits apart)."""
    rng = np.random.default_rng(seed)
    width, height = size
    y, x = np.mgrid[0:height, 0:width] / max(size)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = np.cos(angle) * x + np.sin(angle) * y
    ramp = ((ramp - ramp.min()) / np.ptp(ramp))[..., None]
    colour = rng.integers(0, 256, 3)
    image = Image.fromarray((ramp * colour + (1 - ramp) * (255 - colour)).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for shape in (draw.ellipse, draw.rectangle):
        left, top = rng.integers(0, width * 2 // 3), rng.integers(0, height * 2 // 3)
        shape([left, top, left + rng.integers(width // 6, width // 3), top + rng.integers(height // 6, height // 3)],
              fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    return image


def save_picture(path, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    picture(seed).save(path, format='JPEG', quality=90)


def lst_paths(out, split):
    return [line.split('\t')[2] for line in (out / f'{split}.lst').read_text().splitlines()]


def duplicate_rows(out):
    header, *rows = (out / 'duplicates.txt').read_text().splitlines()
    assert header == 'kind\tdistance\tval file\ttrain file'
    return [tuple(row.split('\t')) for row in rows]


@pytest.mark.integration
def test_copies_of_training_images_in_val_are_named_and_dropped(tmp_path):
    """Leakage: of 8 distinct val pictures and 2 copies of train pictures (one byte for byte, one resized to 96x72
    and re-encoded at JPEG quality 70), exactly the copies are reported, with both files, on stderr and in
    duplicates.txt; --drop-duplicates leaves them out of val.{lst,rec} and the train originals stay."""
    src = tmp_path / 'src'
    for split, count, first in (('train', 4, 0), ('val', 2, 100)):
        for c, name in enumerate('abc'):
            for i in range(count):
                save_picture(str(src / split / name / f'{i}.jpg'), seed=first + 10 * c + i)
    shutil.copy(src / 'train' / 'a' / '1.jpg', src / 'val' / 'a' / 'copy.jpg')
    with Image.open(src / 'train' / 'b' / '2.jpg') as image:
        image.resize((96, 72)).save(src / 'val' / 'c' / 'resized.jpg', format='JPEG', quality=70)
    out = tmp_path / 'out'
    result = run_script('scripts/prepare_dataset.py', src, out, '--workers', '2')
    assert 'leakage: 2 of the 8 val images are copies of train images (1 identical bytes, 1 the same picture)' \
        in result.stderr
    assert '  val/a/copy.jpg <-> train/a/1.jpg: identical bytes\n' in result.stderr
    assert '  val/c/resized.jpg <-> train/b/2.jpg: same picture, hash distance ' in result.stderr
    assert result.stderr.splitlines()[-1].startswith('hint: 2 val images are copies of training images (')
    assert result.stderr.endswith('rerun with --drop-duplicates to leave them out (the training copies stay)\n')
    rows = duplicate_rows(out)
    assert sorted(row[0::2] for row in rows) == [('identical bytes', 'val/a/copy.jpg'),
                                                 ('same picture', 'val/c/resized.jpg')]
    assert dict((row[2], row[3]) for row in rows) == {'val/a/copy.jpg': 'train/a/1.jpg',
                                                      'val/c/resized.jpg': 'train/b/2.jpg'}
    assert [int(row[1]) <= 4 for row in rows] == [True, True]
    assert len(lst_paths(out, 'val')) == 8

    dropped = tmp_path / 'dropped'
    result = run_script('scripts/prepare_dataset.py', src, dropped, '--workers', '2', '--drop-duplicates')
    assert '--drop-duplicates: those copies are left out of val; the train files stay' in result.stderr
    assert 'hint:' not in result.stderr
    assert sorted(lst_paths(dropped, 'val')) == sorted(set(lst_paths(out, 'val')) - {'a/copy.jpg', 'c/resized.jpg'})
    assert len(read_records(dropped, 'val')) == 6
    assert {'a/1.jpg', 'b/2.jpg'} <= set(lst_paths(dropped, 'train')) and len(read_records(dropped, 'train')) == 12
    assert duplicate_rows(dropped) == rows


@pytest.mark.integration
def test_a_picture_in_two_class_folders_is_found_across_the_drawn_split(tmp_path):
    """--val-fraction: the same file in two class folders of SRC, drawn into val once and into train once, is
    named with both paths (relative to SRC)."""
    for c, name in enumerate('ab'):
        save_picture(str(tmp_path / 'src' / name / 'own.jpg'), seed=c)
    save_picture(str(tmp_path / 'src' / 'a' / 'twice.jpg'), seed=7)
    shutil.copy(tmp_path / 'src' / 'a' / 'twice.jpg', tmp_path / 'src' / 'b' / 'twice.jpg')
    out = tmp_path / 'out'
    result = run_script('scripts/prepare_dataset.py', tmp_path / 'src', out, '--val-fraction', '0.5',
                        '--workers', '1')
    val, train = lst_paths(out, 'val'), lst_paths(out, 'train')
    copies = [path for path in val if path.endswith('twice.jpg')]
    assert len(copies) == 1 and len(val) == 2, val   # the default seed's draw: one copy in each split
    original = next(path for path in train if path.endswith('twice.jpg'))
    assert f'  {copies[0]} <-> {original}: identical bytes' in result.stderr
    assert duplicate_rows(out) == [('identical bytes', '0', copies[0], original)]


@pytest.mark.unit
def test_matching_finds_exactly_the_planted_copies_among_200k_hashes():
    """find_copies at scale: 200,000 random 64-bit training hashes and 5,000 held-out ones with copies planted
    at 0 to 4 bits (found), one at 5 bits (not found); 3,000 blank pictures (hash 0) crowd every band of 0: a
    blank held-out picture is found all the same (identical hashes), one bit from blank is reported as crowded.
    Well under a second here; comparing every pair (10^9) would take minutes."""
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    try:
        import prepare_dataset
    finally:
        sys.path.remove(os.path.join(ROOT, 'scripts'))
    rng = np.random.default_rng(55)
    references = rng.integers(0, 2**64, 200_000, dtype=np.uint64)
    references[rng.choice(len(references), 3000, replace=False)] = 0
    # Random held-out hashes with no nibble 0: none shares a band (7 bits or more) with the blank hash.
    nibbles = rng.integers(1, 16, (5000, 16), dtype=np.uint64)
    queries = (nibbles << np.arange(0, 64, 4, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
    planted = {}
    for query, bits in zip(rng.choice(np.arange(2, len(queries)), 7, replace=False), (0, 1, 2, 3, 4, 4, 5)):
        reference = int(rng.integers(len(references)))
        while references[reference] == 0:
            reference = int(rng.integers(len(references)))
        flips = sum(1 << int(bit) for bit in rng.choice(64, bits, replace=False))
        queries[query] = int(references[reference]) ^ flips
        if bits <= 4:
            planted[int(query)] = (reference, bits)
    queries[:2] = 0, 1 << 63
    planted[0] = (int(np.flatnonzero(references == 0)[0]), 0)
    started = time.time()
    query, reference, distances, crowded = prepare_dataset.find_copies(queries, references, 4)
    assert time.time() - started < 5
    assert dict(zip(query.tolist(), zip(reference.tolist(), distances.tolist()))) == planted
    assert crowded == 1


@pytest.mark.unit
def test_the_record_writer_writes_what_mxnets_writes_byte_for_byte(tmp_path):
    """records.RecordWriter (prepare_dataset.py's, without MXNet) against MXNet's MXIndexedRecordIO: payloads of
    every length modulo 4, and payloads holding the magic word at 4-byte boundaries (stored in parts) and off
    them (not split); RecordFile reads the parts back whole."""
    from rn50.data import records
    magic = (0xced7230a).to_bytes(4, 'little')
    images = [b'', b'a', b'ab', b'abc', b'abcd' * 3, magic + b'xyz', b'xx' + magic + b'yy' + magic,
              b'1234' + magic + b'5678' + magic + magic + b'9', magic * 3, b'abcdefgh' * 100 + magic]
    ours, theirs = tmp_path / 'ours', tmp_path / 'theirs'
    with records.RecordWriter(f'{ours}.rec', f'{ours}.idx') as writer:
        for key, image in enumerate(images):
            writer.write(key, float(key % 3), image)
    mxnet_writer = mx.recordio.MXIndexedRecordIO(f'{theirs}.idx', f'{theirs}.rec', 'w')
    for key, image in enumerate(images):
        mxnet_writer.write_idx(key, mx.recordio.pack(mx.recordio.IRHeader(0, float(key % 3), key, 0), image))
    mxnet_writer.close()
    assert (tmp_path / 'ours.rec').read_bytes() == (tmp_path / 'theirs.rec').read_bytes()
    assert (tmp_path / 'ours.idx').read_text() == (tmp_path / 'theirs.idx').read_text()
    payloads, labels = records.RecordFile(f'{ours}.rec', f'{ours}.idx', 3, 'test').read(range(len(images)))
    assert [bytes(p) for p in payloads] == images and list(labels) == [k % 3 for k in range(len(images))]
