"""scripts/prepare_dataset.py and scripts/make_demo_dataset.py on real images."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from conftest import run_script

pytestmark = pytest.mark.integration

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


def test_missing_split_is_a_clear_error(tmp_path):
    result = run_script('scripts/prepare_dataset.py', tmp_path / 'nowhere', tmp_path / 'out', check=False)
    assert result.returncode == 2 and 'is not a folder' in result.stderr


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
