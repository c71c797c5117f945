"""A training set alone from the quick start's photos/<class>/ layout (issue 37, item 6): `--splits train` on
class folders and `--val-fraction 0` each write train.* from every readable image in one command."""
import json

import pytest

from conftest import run_script
from test_prepare_dataset import read_records, tree  # noqa: F401 (tree is a fixture)

pytestmark = pytest.mark.integration


def test_splits_train_on_class_folders_takes_every_image(tree, tmp_path):  # noqa: F811
    """tree/train is a photos/<class>/ folder: cat (6 JPEGs and a broken one), dog (6 JPEGs, a PNG, a text
    file), empty. --splits train writes the 13 readable images to train.*, no val.*, and says what it did;
    --val-fraction 0 and --val-fraction 0 --splits train write the same files."""
    src, out = tree / 'train', tmp_path / 'out'
    result = run_script('scripts/prepare_dataset.py', src, out, '--splits', 'train', '--workers', '2')
    assert (f'--splits train: {src} has no train/ folder, so its 3 folders are the classes and every image goes '
            'to train.*') in result.stderr
    assert f'{src}: 15 files in 3 classes, all for training (no validation split: train with --mode train)' in \
        result.stderr
    assert len(read_records(out, 'train')) == 13 and not (out / 'val.rec').exists()
    assert [c['folder'] for c in json.loads((out / 'classes.json').read_text())['classes']] == ['cat', 'dog', 'empty']
    assert 'broken.jpg' in (out / 'train_skipped.txt').read_text()
    for flags in (['--val-fraction', '0'], ['--val-fraction', '0', '--splits', 'train']):
        again = tmp_path / '-'.join(flags)
        run_script('scripts/prepare_dataset.py', src, again, *flags, '--workers', '1')
        for ext in ('lst', 'rec', 'idx'):
            assert (again / f'train.{ext}').read_bytes() == (out / f'train.{ext}').read_bytes(), (flags, ext)
        assert not (again / 'val.rec').exists()


def test_a_train_only_conversion_over_an_earlier_split_warns_of_its_val_files(tree, tmp_path):  # noqa: F811
    out = tmp_path / 'out'
    run_script('scripts/prepare_dataset.py', tree / 'train', out, '--val-fraction', '0.34', '--workers', '1')
    result = run_script('scripts/prepare_dataset.py', tree / 'train', out, '--splits', 'train', '--workers', '1')
    assert f'warning: {out / "val.rec"} (and val.idx) is from an earlier conversion and stays' in result.stderr
    assert len(read_records(out, 'train')) == 13


def test_what_stays_refused(tree, tmp_path):  # noqa: F811
    """--val-fraction 0 on a tree split already is still an error; so is --splits val on class folders, and the
    hint for SRC/<class>/ without flags names both ways."""
    split = run_script('scripts/prepare_dataset.py', tree, tmp_path / 'a', '--val-fraction', '0', check=False)
    assert split.returncode == 2 and 'is split already (train/ and val/): leave --val-fraction out' in split.stderr
    val = run_script('scripts/prepare_dataset.py', tree / 'train', tmp_path / 'b', '--splits', 'val', check=False)
    assert val.returncode == 2 and val.stderr.count('error:') == 1
    plain = run_script('scripts/prepare_dataset.py', tree / 'train', tmp_path / 'c', check=False)
    assert plain.returncode == 2 and 'add --val-fraction 0.2 to hold out 20% for validation, or convert every ' \
        'image for training with --splits train' in plain.stderr
