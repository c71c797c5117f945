"""--classes: every class-name format the recipe writes or reads names the classes in label order; a
malformed file or a wrong class count is one `error:` line before anything starts."""
import argparse
import json

import pytest

from rn50.inference import prediction
import train
from conftest import runner_main
from rn50.errors import RecipeError

pytestmark = pytest.mark.unit

NAMES = ['zero', 'one', 'two']


def names_from(tmp_path, text, num_classes=3, name='classes.txt'):
    path = tmp_path / name
    path.write_text(text)
    args = argparse.Namespace(classes=str(path), num_classes=num_classes, data_train=None, data_val=None)
    return prediction.class_names(args.num_classes, args.classes, (args.data_train, args.data_val))


@pytest.mark.parametrize('text', [
    # prepare_dataset.py's classes.json (entries out of order: the index decides)
    json.dumps({'classes': [{'index': 1, 'folder': 'b', 'name': 'one'}, {'index': 0, 'folder': 'a', 'name': 'zero'},
                            {'index': 2, 'folder': 'c', 'name': 'two'}]}),
    json.dumps({'classes': NAMES}),                                  # {"classes": [names]}
    json.dumps(NAMES),                                               # a JSON list
    'c_folder\ttwo\na_folder\tzero\nb_folder\tone\n',                # --names: sorted folder order
    'n00000002 two\nn00000000 zero\nn00000001 one\n',                # imagenet_classes.txt's lines
    'zero\none\n\ntwo\n',                                            # one name per line
])
def test_every_format_the_recipe_writes_or_reads_names_the_classes_in_label_order(tmp_path, text):
    assert names_from(tmp_path, text) == NAMES


def test_the_files_the_recipe_writes_are_read_as_written(digits):
    """prepare_dataset.py's classes.json and make_demo_dataset.py's --names file of the digits."""
    written = json.loads((digits / 'rec' / 'classes.json').read_text())['classes']
    expected = [entry['name'] for entry in sorted(written, key=lambda entry: entry['index'])]
    for path in (digits / 'rec' / 'classes.json', digits / 'images' / 'names.txt'):
        args = argparse.Namespace(classes=str(path), num_classes=10, data_train=None, data_val=None)
        assert prediction.class_names(args.num_classes, args.classes, (args.data_train, args.data_val)) == expected


@pytest.mark.parametrize('text, message', [
    ('{"classes": [', 'is not valid JSON (line 1 column 14: Expecting value)'),
    (json.dumps({'labels': NAMES}), 'expected a "classes" list'),
    (json.dumps([1, 2, 3]), 'entry 0 (1) is neither a name nor an object'),
    (json.dumps({'classes': [{'index': 0, 'name': 'a'}, {'index': 0, 'name': 'b'}, {'index': 2, 'name': 'c'}]}),
     'entry 1 has index 0'),
    ('a\tzero\na\tone\nb\ttwo\n', "folder 'a' is listed twice"),
    ('zero\none\n', 'names 2 classes but the network has 3 (--num-classes)'),
    ('zero\none\ntwo\nthree\n', 'names 4 classes but the network has 3'),
])
def test_a_malformed_file_or_a_wrong_count_is_a_clear_error(tmp_path, text, message):
    with pytest.raises(RecipeError) as error:
        names_from(tmp_path, text)
    assert message in str(error.value)


def test_a_bad_classes_file_stops_the_runner_before_launch(digits, tmp_path):
    bad = tmp_path / 'classes.json'
    bad.write_text('{"classes": [')
    result = runner_main('--mode', 'pred', '--dtype', 'float32', '--num-classes', '10', '--image-shape', '3,32,32',
                         '--data-root', digits / 'rec', '--workspace', tmp_path / 'w', '--data-pred',
                         digits / 'images' / 'val' / 'digit_3', '--classes', bad)
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f'error: --classes {bad} is not valid JSON')
    assert not (tmp_path / 'w').exists()   # nothing started


def test_the_class_count_comes_from_the_datasets_classes_json(digits):
    """Issue 23 item 7: without --num-classes, a dataset whose classes.json lists 10 classes trains a 10-way
    classifier (it was a 1000-way one, without a word); without a classes.json the count stays 1000."""
    rec = digits / 'rec'
    data = ['--data-train', str(rec / 'train.rec'), '--data-val', str(rec / 'val.rec')]
    args, origin = train.parse_flags(data)
    assert (args.num_classes, origin.num_classes_source) == (10, str(rec / 'classes.json'))
    assert train.parse_flags(data + ['--num-classes', '10'])[0].num_classes == 10
    assert train.parse_flags(['--data-backend', 'synthetic'])[0].num_classes == 1000
    assert train.parse_flags(data + ['--data-backend', 'synthetic'])[0].num_classes == 1000   # unread
    assert train.parse_flags(['--num-classes', '7'])[0].num_classes == 7


def test_a_num_classes_that_contradicts_the_dataset_stops_the_runner_before_launch(digits, tmp_path):
    result = runner_main('--dtype', 'float32', '--num-classes', '1000', '--image-shape', '3,32,32', '--data-root',
                         digits / 'rec', '--workspace', tmp_path / 'w')
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f'error: --num-classes 1000 contradicts the dataset\'s {digits / "rec" / "classes.json"}, '
                           'which names 10 classes'), last
    assert not (tmp_path / 'w').exists()
