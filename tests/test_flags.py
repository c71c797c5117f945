"""flags.py: every numeric flag has its range checked at parse time, with argparse's `error:` line and exit 2;
the schedule's flags are checked together before anything starts."""
import argparse
import re

import pytest

import fit
from rn50 import flags
import train
from conftest import in_process, runner_main, train_main
from rn50.errors import RecipeError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('argv, message', [
    (['--batch-size', '-32'], 'expected at least 1'),
    (['--batch-size', '0'], 'expected at least 1'),
    (['--disp-batches', '0'], 'expected at least 1'),
    (['--seed', '-1'], 'expected from 0'),
    (['--lr', 'nan'], 'not a finite number'),
    (['--lr', '-1'], 'expected > 0'),
    (['--wd', 'nan'], 'not a finite number'),
    (['--mixup', '-1'], 'expected at least 0'),
    (['--warmup-epochs', '-1'], 'expected at least 0'),
    (['--label-smoothing', '2'], 'expected from 0'),
    (['--num-epochs', '0'], 'expected at least 1'),
    (['--num-epochs', '-1'], 'expected at least 1'),
    (['--run-epochs', '0'], 'expected at least 1, or -1'),
    (['--topk', '0'], 'expected at least 1'),
    (['--num-examples', '0'], 'expected at least 1'),
    (['--benchmark-iters', '0'], 'expected at least 1'),
    (['--calib-batches', '0'], 'expected at least 1'),
    (['--image-shape', '2,32,32'], 'expected C,H,W'),
    (['--image-shape', '3,32'], 'expected C,H,W'),
    (['--rgb-mean', '1,inf,2'], 'not a finite number'),
    (['--gpus', '0,-1'], 'expected at least 0'),
    (['--num-classes', '1'], 'expected at least 2'),
    (['--batchnorm-eps', '0'], 'expected > 0'),
    (['--mom', '1.5'], 'expected from 0'),
    (['--dali-threads', '0'], 'expected at least 1'),
    (['--save-frequency', '-2'], 'expected at least -1'),
])
def test_out_of_range_flags_stop_at_parse_time(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        train.parse_flags(argv)[0]
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines            # one line: argparse printed train.py's 94 lines of usage first
    assert lines[0].startswith('error: argument ') and re.search(message, lines[0]), lines
    assert lines[0].endswith('(train.py --help lists the flags)')


def test_values_in_range_and_sentinels_pass():
    args = train.build_parser().parse_args(['--run-epochs', '-1', '--save-frequency', '-1', '--seed', '0',
                                            '--min-random-aspect-ratio', 'None', '--lr-steps', '30,60',
                                            '--label-smoothing', '0', '--gpus', '0,2'])
    assert (args.run_epochs, args.save_frequency, args.seed) == (-1, -1, 0)
    assert args.min_random_aspect_ratio is None and args.lr_steps == [30.0, 60.0] and args.gpus == [0, 2]


def test_type_messages():
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not a whole number"):
        flags.integer(minimum=1)('x')
    with pytest.raises(argparse.ArgumentTypeError, match='expected from 0 .included. to 1'):
        flags.real(minimum=0, maximum=1)('1.5')
    assert flags.positive_int_list('1,4,8') == [1, 4, 8]
    with pytest.raises(argparse.ArgumentTypeError, match='one or more'):
        flags.positive_int_list(',')


SCHEDULE_ERRORS = [
    (['--lr-steps', '60,30'], '--lr-steps 60,30: the epochs must increase, each once (e.g. 30,60)'),
    (['--lr-steps', '30,30,60'], '--lr-steps 30,30,60: the epochs must increase'),
    (['--warmup-epochs', '6', '--num-epochs', '5'], '--warmup-epochs 6 is longer than the 5-epoch schedule'),
    (['--warmup-epochs', '91'], '--warmup-epochs 91 is longer than the 90-epoch schedule'),
]


@pytest.mark.parametrize('argv, message', SCHEDULE_ERRORS)
def test_a_schedule_that_cannot_be_meant_is_refused(argv, message):
    with pytest.raises(RecipeError) as refused:
        fit.check_schedule_flags(*train.parse_flags(argv))
    assert str(refused.value).startswith(message)


def test_schedules_that_can_be_meant_pass():
    for argv in (['--lr-steps', '30,60,80'], ['--warmup-epochs', '5', '--num-epochs', '5'],
                 ['--num-epochs', '2'],                               # the default warmup, in a short run
                 ['--lr-steps', '60,30', '--mode', 'val']):           # no schedule in val mode
        fit.check_schedule_flags(*train.parse_flags(argv))


@pytest.mark.parametrize('argv, message', SCHEDULE_ERRORS[:1] + SCHEDULE_ERRORS[2:3])
def test_train_py_and_the_runner_refuse_them_before_anything_starts(argv, message, tmp_path):
    common = ['--data-backend', 'synthetic', '--num-layers', '10', '--image-shape', '3,32,32', '--num-examples', '64',
              '--workspace', str(tmp_path / 'w')]
    for main, command in ((train_main, ['--batch-size', '8']), (runner_main, ['-n', '2', '-b', '8'])):
        result = main(*command, *common, *argv)
        assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1].startswith(f'error: {message}'), result.stderr[-2000:]
        assert not (tmp_path / 'w').exists()   # nothing started, nothing written


def test_help_says_each_default_once_and_where_other_flags_go(monkeypatch):
    import benchmark
    monkeypatch.setenv('COLUMNS', '80')         # the width of a help printed to a pipe
    parser = train.build_parser()
    text = parser.format_help()
    assert '(default: None)' not in text and '(default: False)' not in text
    formatter = flags.HelpFormatter('train.py')
    for action in parser._actions:      # argparse's "(default: X)" only where the text names no default itself
        said = formatter._get_help_string(action)
        assert said == action.help or 'default' not in (action.help or '').lower(), said
    runner_help = runner_main('--help')
    assert runner_help.returncode == 0 and 'Every other flag goes to train.py' in runner_help.stdout
    benchmark_help = in_process(benchmark.main, '--help')
    assert benchmark_help.returncode == 0 and 'Every other flag goes to' in benchmark_help.stdout


@pytest.mark.parametrize('flag', [['--grad-accum-steps', '0'], ['--keep-checkpoints', '-1'],
                                  ['--target-accuracy', '1.5'], ['--target-accuracy', '0'],
                                  ['--model-ema-decay', '1.1'], ['--model-ema-steps', '0'], ['--cutmix', '-1'],
                                  ['--mixup-switch-prob', '2']])
@pytest.mark.unit
def test_new_flags_are_range_checked(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_flags(flag)[0]
    assert exit_info.value.code == 2 and 'out of range' in capsys.readouterr().err


def test_the_flags_a_command_names_are_those_it_gives_itself():
    """resolve.given_flags: `--flag value` and `--flag=value` name a flag; a longer flag that begins like another
    (--data-train-idx, --data-train) names only itself, and a value never names one."""
    from rn50.config import resolve
    given = resolve.given_flags(train.build_parser(), ['--data-train-idx', 'a.idx', '--lr=0.1', '--batch-size', '8',
                                                       '--workspace', 'lr', '--data-val=v.rec'])
    assert given == {'data_train_idx', 'lr', 'batch_size', 'workspace', 'data_val'}
    assert resolve.given_flags(train.build_parser(), ['--batch-size8', '--lr0.1', 'lr', '--']) == frozenset()
