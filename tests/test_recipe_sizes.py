"""The sizes a recipe trains and tests at, and its warm-up on short runs (issue 37, items 1, 2 and 7): a test size
other than the run's comes with a resize at the run's ratio (or the one given), a recipe shrunk to small images
tests at its own ratios to the new size, and a recipe's warm-up is shortened to fit a short run, all logged."""
import json
import os

import pytest

import fit
import train
from rn50.config import recipes
from rn50.optim import schedule
from conftest import ROOT, copy_workspace, run_mode, runner_module, runner_runs, train_args, train_main
from rn50.errors import RecipeError

TINY = ['--seed', '3', '--batch-size', '32', '--data-mxnet-threads', '2', '--dali-threads', '1',
        '--dali-validation-threads', '1', '--num-layers', '10', '--num-examples', '64']


def train_py(*argv):
    return run_mode(*TINY, *argv, check=False)


def data_flags(digits):
    rec = digits / 'rec'
    return ['--data-train', rec / 'train.rec', '--data-train-idx', rec / 'train.idx', '--data-val', rec / 'val.rec',
            '--data-val-idx', rec / 'val.idx']


def val_report(workspace):
    return json.loads((workspace / 'report_val.json').read_text())


# ---- 1. testing at another size than the run's ----------------------------------------------------------------

@pytest.fixture
def apart(trained_apart, tmp_path):
    """conftest's trained_apart, a ResNet-10 trained 1 epoch at 32x32 and tested at 40x40 after a 46 resize (the
    digits are 32x32 JPEGs), copied: the tests validate and predict in it."""
    return copy_workspace(trained_apart, tmp_path / 'apart')


@pytest.mark.integration
def test_another_test_size_resizes_at_the_runs_ratio(apart, digits):
    """--val-image-shape 3,32,32 on a run tested at 40 after 46: the resize follows (37, not a 32-px patch of a
    46-px image), logged, and validates as the same command with --data-val-resize 37 given; 48 (larger than
    the run's 46, refused before) resizes to 55."""
    data = data_flags(digits) + ['--data-backend', 'mxnet', '--workspace', apart]
    val = train_py(*data, '--mode', 'val', '--val-image-shape', '3,32,32')
    assert val.returncode == 0, val.stderr[-3000:]
    log = (apart / 'log.log').read_text()
    assert ('Testing at 32x32 (--val-image-shape), the run at 40x40 after resizing to 46: --data-val-resize 37, '
            "the run's resize at the same ratio") in log
    derived = val_report(apart)
    assert derived['config']['data_val_resize'] == 37 and derived['config']['val_image_shape'][1:] == [32, 32]
    given = train_py(*data, '--mode', 'val', '--val-image-shape', '3,32,32', '--data-val-resize', '37')
    assert given.returncode == 0, given.stderr[-3000:]
    assert val_report(apart)['summary']['val.accuracy'] == derived['summary']['val.accuracy']
    larger = train_py(*data, '--mode', 'val', '--val-image-shape', '3,48,48')
    assert larger.returncode == 0, larger.stderr[-3000:]
    assert val_report(apart)['config']['data_val_resize'] == 55


@pytest.mark.integration
def test_a_resize_given_with_another_test_size_wins(apart, digits):
    """--val-image-shape 3,32,32 --data-val-resize 34: the user's resize, logged as given (it was refused as
    'trained with other settings'); pred takes it too. The run's own test size with another resize stays a
    contradiction, and a resize smaller than the asked size one error line."""
    data = data_flags(digits) + ['--data-backend', 'mxnet', '--workspace', apart]
    val = train_py(*data, '--mode', 'val', '--val-image-shape', '3,32,32', '--data-val-resize', '34')
    assert val.returncode == 0, val.stderr[-3000:]
    assert val_report(apart)['config']['data_val_resize'] == 34
    assert 'the run at 40x40 after resizing to 46: --data-val-resize 34 (given)' in (apart / 'log.log').read_text()
    pred = train_py('--mode', 'pred', '--workspace', apart, '--val-image-shape', '3,32,32', '--data-pred',
                    digits / 'images' / 'val' / 'digit_3')
    assert pred.returncode == 0 and '1. ' in pred.stdout, pred.stderr[-3000:]
    assert '--data-val-resize 37, the run\'s resize at the same ratio' in pred.stderr
    same = train_main(*TINY, *data, '--mode', 'val', '--data-val-resize', '50')        # refusals: in process
    assert same.returncode == 2 and '--data-val-resize 50 (trained with 46)' in same.stderr
    small = train_main(*TINY, *data, '--mode', 'val', '--val-image-shape', '3,48,48', '--data-val-resize', '40')
    assert small.returncode == 2 and small.stderr.count('error:') == 1
    assert 'error: --data-val-resize 40 is smaller than the image (48x48)' in small.stderr


# ---- 2. a recipe shrunk to small images ------------------------------------------------------------------------

@pytest.mark.parametrize('name, size, tested, resize', [
    ('torchvision-v2', 64, 81, 84),      # 176 -> 224 after 232
    ('rsb-a3', 64, 90, 95),              # 160 -> 224 after 236
    ('rsb-a3', 192, 269, 283),
    ('torchvision-v2', 176, 224, 232),   # the recipe's own
])
@pytest.mark.unit
def test_a_recipes_test_size_and_resize_follow_the_training_size(name, size, tested, resize):
    """By the recipe's own ratios, in train.py's resolution and through the runner (whose --image-shape is the
    recipe's training size unless the user gives one)."""
    args = train_args(['--recipe', name, '--image-shape', f'3,{size},{size}'])
    assert (args.val_image_shape[1:], args.data_val_resize) == ((tested, tested), resize)
    runner = runner_module()
    options, forwarded = runner.parse_args(['-n', '1', '-b', '8', '--recipe', name, '--image-shape',
                                            f'3,{size},{size}'])
    command = runner.train_command(options, forwarded, 0, False, [])
    through = train_args(command[command.index(os.path.join(ROOT, 'train.py')) + 1:])
    assert (through.image_shape[1:], through.val_image_shape[1:], through.data_val_resize) == \
        ((size, size), (tested, tested), resize)


@pytest.mark.unit
def test_sizes_the_command_gives_win_and_the_rest_follows():
    """A given test size takes the recipe's resize ratio (288 -> 298 at torchvision's 232/224); a given resize
    stays; both given, nothing follows; recipes without a test size of their own set none."""
    args = train_args(['--recipe', 'torchvision-v2', '--val-image-shape', '3,288,288'])
    assert (args.image_shape[1:], args.val_image_shape[1:], args.data_val_resize) == ((176, 176), (288, 288), 298)
    args = train_args(['--recipe', 'torchvision-v2', '--image-shape', '3,64,64', '--data-val-resize', '100'])
    assert (args.val_image_shape[1:], args.data_val_resize) == ((81, 81), 100)
    args, origin = train.parse_flags(['--recipe', 'rsb-a3', '--image-shape', '3,64,64', '--val-image-shape',
                                      '3,64,64', '--data-val-resize', '73'])
    assert (args.val_image_shape[1:], args.data_val_resize) == ((64, 64), 73)
    assert recipes.size_words(args, origin.from_recipe) is None
    args, origin = train.parse_flags(['--recipe', 'mlperf', '--image-shape', '3,64,64'])   # plain: 64 x 256 / 224
    assert (args.val_image_shape, args.data_val_resize) == (None, 73) and recipes.size_words(args, origin.from_recipe) is None


@pytest.mark.integration
def test_a_recipe_shrunk_to_the_digits_validates_at_its_ratios(digits, tmp_path):
    """./runner --recipe torchvision-v2 --image-shape 3,32,32 on the 32x32 digits: validation at 41x41 after a 42
    resize (it was 224 after 232, the digits blown up 7 times), said in the log; --mode val at 32 on that run
    resizes to 33 (the issue's run kept 232 and tested a 64-px patch of it)."""
    workspace = tmp_path / 'shrunk'
    argv = ['-n', '1', '-b', '16', '-e', '1', '--warmup-epochs', '0', '--data-root', digits / 'rec', '--recipe',
            'torchvision-v2', '--image-shape', '3,32,32', '--num-layers', '10', '--num-examples', '64',
            '--dali-threads', '1', '--dali-validation-threads', '1', '--workspace', workspace]
    result = runner_runs(*argv)       # in this process, the train.py it starts too
    assert result.returncode == 0, result.stderr[-3000:]
    assert ('Recipe torchvision-v2 trains at 176x176 and tests at 224x224 after resizing to 232; this run trains at '
            "32x32 and tests at 41x41 after resizing to 42, the recipe's ratios (--val-image-shape and "
            '--data-val-resize not given)') in (workspace / 'log.log').read_text()
    config = json.loads((workspace / 'report.json').read_text())['config']
    assert (config['val_image_shape'][1:], config['data_val_resize']) == ([41, 41], 42)
    val = train_py('--mode', 'val', '--workspace', workspace, '--data-backend', 'dali-cpu',
                   '--val-image-shape', '3,32,32', *data_flags(digits)[4:])
    assert val.returncode == 0, val.stderr[-3000:]
    assert val_report(workspace)['config']['data_val_resize'] == 33


# ---- 7. a recipe's warm-up on a short run ----------------------------------------------------------------------

@pytest.mark.unit
def test_a_recipes_warm_up_is_shortened_to_fit_a_short_run(caplog):
    """Half of a run shorter than twice the recipe's warm-up (5 epochs: -e 3 gives 1.5), as the default's; a
    --warmup-epochs the command gives stays an error when longer than the run."""
    for name, epochs, expected in (('torchvision-v2', 3, 1.5), ('rsb-a3', 5, 2.5), ('mlperf', 3, 1.5),
                                   ('torchvision-v2', 10, 5.0), ('mlperf', 37, 2.0)):
        args, origin = train.parse_flags(['--recipe', name, '--num-epochs', str(epochs)])
        fit.check_schedule_flags(args, origin)
        with caplog.at_level('INFO', logger='rn50.optim.schedule'):
            caplog.clear()
            assert schedule.default_warmup(args.warmup_epochs, args.num_epochs, args.recipe) == expected
        said = f"half of the {epochs}-epoch run (--recipe {name}'s"
        assert (said in caplog.text) == (expected < recipes.RECIPES[name]['flags']['warmup_epochs'])
    with pytest.raises(RecipeError, match='--warmup-epochs 4 is longer than the 3-epoch schedule'):
        fit.check_schedule_flags(*train.parse_flags(['--recipe', 'torchvision-v2', '--num-epochs', '3',
                                                     '--warmup-epochs', '4']))
    args, origin = train.parse_flags(['--recipe', 'rsb-a3', '--num-epochs', '3', '--warmup-epochs', '2'])
    assert schedule.default_warmup(args.warmup_epochs, args.num_epochs,
                                   args.recipe if 'warmup_epochs' in origin.from_recipe else None) == 2


@pytest.mark.integration
def test_a_recipe_trains_one_epoch_on_the_digits_with_its_warm_up_shortened(digits, tmp_path):
    """--recipe rsb-a3 -e 1 on the digits (refused before: its 5 warm-up epochs are longer than the run): half an
    epoch of warm-up, logged and recorded; the same with --warmup-epochs 5 given is one error line."""
    sizes = ['--image-shape', '3,32,32', '--val-image-shape', '3,32,32', '--data-val-resize', '36']
    workspace = tmp_path / 'short'
    result = train_py(*data_flags(digits), *sizes, '--recipe', 'rsb-a3', '--num-epochs', '1', '--data-backend',
                      'dali-cpu', '--workspace', workspace)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("--warmup-epochs not given: 0.5 epochs of warm-up, half of the 1-epoch run (--recipe rsb-a3's 5 would "
            'leave less than half of it to the decay)') in (workspace / 'log.log').read_text()
    assert json.loads((workspace / 'report.json').read_text())['config']['warmup_epochs'] == 0.5
    given = train_main(*TINY, *data_flags(digits), *sizes, '--recipe', 'rsb-a3', '--num-epochs', '1',
                       '--warmup-epochs', '5', '--workspace', tmp_path / 'given')
    assert given.returncode == 2 and given.stderr.count('error:') == 1
    assert 'error: --warmup-epochs 5 is longer than the 1-epoch schedule' in given.stderr


@pytest.mark.parametrize('flags, resize', [([], 256), (['--image-shape', '3,64,64'], 73),
                                          (['--image-shape', '3,32,32'], 37),
                                          (['--image-shape', '3,32,32', '--val-image-shape', '3,64,64'], 73),
                                          (['--image-shape', '3,64,64', '--data-val-resize', '100'], 100),
                                          (['--recipe', 'nvidia', '--image-shape', '3,128,128'], 146)])
@pytest.mark.unit
def test_a_plain_run_at_another_size_tests_after_the_originals_resize_ratio(flags, resize):
    """The original recipe's 256 is its resize for a test at 224: a run at 64 kept 256 and tested the centre
    64 pixels of a 256-pixel image (a quarter of its side), without a word. Not given, the resize is the test
    size x 256/224; given, it is the user's."""
    assert train_args(flags).data_val_resize == resize


@pytest.mark.integration
def test_the_derived_resize_is_logged(digits, tmp_path):
    result = train_py(*data_flags(digits), '--mode', 'train_val', '--num-epochs', '1', '--workspace', tmp_path,
                      '--image-shape', '3,32,32', '--num-classes', '10', '--data-backend', 'dali-cpu')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--data-val-resize 37: the test size at the original recipe's 256/224 (not given)" in result.stderr
