"""The MLPerf result log (mlperf_log.py, written through MLCommons' mllog) against MLCommons' own compliance checker
(mlperf_logging.compliance_checker, training ruleset 4.0.0) and the run rules of issue 39 beyond it (times in
order, every interval closed, evaluation on the period only, the stop at the target, no log for a resumed run), on
simulated runs and on real ones of the digits with --recipe mlperf, on 1 and 2 workers (both closed, checked by the
checker's closed rules as they are: nothing relaxed)."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import yaml

from conftest import ROOT, resolved, runner_runs, train_args

import fit
import train
from rn50.config import resolve
from rn50.errors import RecipeError
from rn50.reports import mlperf_log
from rn50.checkpoints.workspace import Workspace
from rn50.world import workers

HOROVOD = pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
RUN_ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' + os.environ['PATH'])
FIELDS = ['namespace', 'time_ms', 'event_type', 'key', 'value', 'metadata']


# ---- the rules ---------------------------------------------------------------------------------------------------

def checker(path):
    """MLCommons' compliance checker on the log at `path` (training, ruleset 4.0.0; the division, benchmark and
    optimizer rules it reads follow the log's own keys), its warnings counted as failures (--werror): (passed, its
    report). Passed is its exit status 0 with SUCCESS; the report (stderr) names the rule files it read and every
    failed check."""
    result = subprocess.run([sys.executable, '-m', 'mlperf_logging.compliance_checker', '--usage', 'training',
                             '--ruleset', '4.0.0', '--werror', '--log_output', os.devnull, str(path)],
                            capture_output=True, text=True, timeout=120)
    return result.returncode == 0 and result.stderr.rstrip().endswith('SUCCESS'), result.stderr


def checked(lines, folder):
    """checker() on `lines` (records) written as a log in `folder`: for logs changed after the fact, to show what
    the checker refuses."""
    path = os.path.join(folder, 'changed.log')
    with open(path, 'w') as f:
        f.writelines(f':::MLLOG {json.dumps(line)}\n' for line in lines)
    return checker(path)


def issue_rules(lines, target=0.759, period=4, offset=2):
    """Issue 39's rules beyond the checker's: the seed, times in order, every interval closed by its own stop
    (with the same epoch_num), evaluations on the period only, run_stop last, and its status: success exactly
    when an evaluation reached the target."""
    messages = []
    if [line['key'] for line in lines].count('seed') != 1:
        messages.append('seed: not exactly once')
    times = [line['time_ms'] for line in lines]
    if times != sorted(times):
        messages.append('time_ms goes back')
    open_intervals = {}
    for line in lines:
        name, kind = line['key'].rsplit('_', 1) if '_' in line['key'] else (line['key'], '')
        epoch = line['metadata'].get('epoch_num')
        if line['event_type'] == 'INTERVAL_START':
            if kind != 'start' or (name, epoch) in open_intervals:
                messages.append(f'{line["key"]}: an interval start that is no *_start, or opened twice')
            open_intervals[(name, epoch)] = line
        elif line['event_type'] == 'INTERVAL_END':
            if kind != 'stop' or open_intervals.pop((name, epoch), None) is None:
                messages.append(f'{line["key"]} (epoch_num {epoch}): ends no open interval')
        elif kind in ('start', 'stop'):
            messages.append(f'{line["key"]}: an interval key as a point in time')
    messages += [f'{key}_start (epoch_num {epoch}): never stopped' for key, epoch in open_intervals]
    evaluated = [line['metadata']['epoch_num'] for line in lines if line['key'] == 'eval_accuracy']
    messages += [f'an evaluation at epoch_num {e}, off the period' for e in evaluated if (e - 1) % period != offset]
    if not lines or lines[-1]['key'] != 'run_stop':
        messages.append('run_stop is not the last line')
    stops = [line for line in lines if line['key'] == 'run_stop']
    reached = any(line['value'] >= target for line in lines if line['key'] == 'eval_accuracy')
    if stops and stops[0]['metadata'].get('status') != ('success' if reached else 'aborted'):
        messages.append(f'run_stop status {stops[0]["metadata"].get("status")} where the target was '
                        f'{"" if reached else "not "}reached')
    return messages


def parse_log(path):
    """The records of a result log (MLCommons' checker parses its format); each names the recipe's call that wrote it
    (metadata file, within the repository, and lineno)."""
    with open(path) as f:
        records = [json.loads(line[len(':::MLLOG '):]) for line in f]
    for record in records:
        assert list(record) == FIELDS, record
        where = record['metadata']
        assert os.path.isfile(os.path.join(ROOT, where['file'])) and where['lineno'] > 0, record
    return records


# ---- a run's log, written by the hooks fit.py calls, without training ---------------------------------------------

def mlperf_args(tmp_path, extra=()):
    """train.py's flags for --recipe mlperf, resolved as train.py resolves them for a CPU run."""
    return resolved(['--recipe', 'mlperf', '--workspace', str(tmp_path), '--seed', '3', '--batch-size', '64',
                     '--mlperf-cache-clear', 'no'] + list(extra))


class EveryWorkerAlike(workers.Communicator):
    """The sums of `size` workers that all contribute this one's values."""

    def allreduce_sum(self, values):
        return np.asarray(values, dtype=np.float64) * self.size


def run_of(args):
    """The MLPerf log's Run of the resolved flags `args`, in their workspace."""
    return mlperf_log.Run.of(args, Workspace.of(args))


def one_worker(rank=0, size=1):
    return workers.World(EveryWorkerAlike(rank=rank, size=size, local_rank=rank))


def simulated_run(args, accuracy, interrupt=None, world=None):
    """The hooks in fit.train's order, for a run whose validation gives accuracy(epoch); `interrupt`: the epoch a
    signal stops. Returns the records of the log."""
    result = mlperf_log.start(mlperf_log.Run.of(args, Workspace.of(args)), world or one_worker(), 3, resumed=False)
    result.data(types.SimpleNamespace(num_examples=1438, num_batches=23), types.SimpleNamespace(num_examples=359))
    for epoch in range(args.num_epochs):
        result.epoch_start(epoch)
        if epoch == interrupt:
            break
        result.epoch_stop(epoch)
        if fit.evaluated(args, epoch):
            result.eval_start(epoch)
            result.eval_stop(epoch, {'val.accuracy': accuracy(epoch)})
            if accuracy(epoch) >= args.target_accuracy:
                break
    result.run_stop()
    return parse_log(mlperf_log.log_path(args.mlperf_log, Workspace.of(args)))


def reaches_at_6(epoch):
    return 0.8 if epoch >= 6 else 0.5


@pytest.fixture
def good_log(tmp_path):
    return simulated_run(mlperf_args(tmp_path), reaches_at_6)


CLOSED_LARS_RULES = ['training_4.0.0/common.yaml', 'training_4.0.0/closed_common.yaml',
                     'training_4.0.0/closed_resnet.yaml', 'training_3.1.0/closed_resnet_lars.yaml']


def rule_files(report):
    """The rule files the checker says it read, in its order (its division, benchmark and optimizer keys choose)."""
    return re.findall(r'Compliance checks: (\S+\.yaml)', report)


@pytest.mark.unit
def test_a_run_that_reaches_the_target_writes_a_log_the_checker_accepts(good_log, tmp_path):
    passed, report = checker(tmp_path / 'mlperf.log')
    assert passed and rule_files(report) == CLOSED_LARS_RULES, report
    assert issue_rules(good_log) == []
    keys = [line['key'] for line in good_log]
    assert keys[:2] == ['init_start', 'cache_clear'] and keys[-4:] == ['eval_start', 'eval_accuracy', 'eval_stop',
                                                                      'run_stop']
    values = {line['key']: line['value'] for line in good_log}
    assert values['submission_benchmark'] == 'resnet' and values['opt_name'] == 'lars'
    assert (values['global_batch_size'], values['lars_opt_base_learning_rate']) == (64, pytest.approx(11.0 * 64 / 3200))
    assert values['lars_opt_learning_rate_decay_steps'] == (37 - 2) * 23 and values['seed'] == 3
    assert values['submission_platform'] == '1xCPU' and values['cache_clear'] is False
    assert [line['metadata']['epoch_num'] for line in good_log if line['key'] == 'eval_accuracy'] == [3, 7]
    assert good_log[-1]['metadata']['status'] == 'success'
    assert mlperf_log.summary(mlperf_log.log_path('mlperf.log', Workspace.of(mlperf_args(tmp_path)))) == {
        'mlperf.log': str(tmp_path / 'mlperf.log'), 'mlperf.status': 'success',
        'mlperf.time_to_train': (good_log[-1]['time_ms'] - keys_time(good_log, 'run_start')) / 1000}


def keys_time(lines, key):
    return next(line['time_ms'] for line in lines if line['key'] == key)


@pytest.mark.unit
def test_a_run_that_misses_the_target_or_is_stopped_ends_aborted_with_every_interval_closed(tmp_path):
    missed = simulated_run(mlperf_args(tmp_path, ['--num-epochs', '8']), lambda epoch: 0.5)
    assert missed[-1]['metadata']['status'] == 'aborted' and issue_rules(missed) == []
    passed, report = checker(tmp_path / 'mlperf.log')     # closed: no evaluation at 0.759 or more
    assert not passed and "Failed checks for eval_accuracy : v['value'] >= 0.7590" in report, report
    stopped = simulated_run(mlperf_args(tmp_path, ['--submission-division', 'open']), reaches_at_6, interrupt=4)
    assert [line['key'] for line in stopped[-3:]] == ['epoch_start', 'epoch_stop', 'run_stop']
    assert stopped[-1]['metadata']['status'] == 'aborted' and issue_rules(stopped) == []
    passed, report = checker(tmp_path / 'mlperf.log')
    assert passed and 'training_4.0.0/open_resnet.yaml' in rule_files(report), report


@pytest.mark.unit
def test_the_sgd_keys_and_an_open_division(tmp_path):
    args = mlperf_args(tmp_path, ['--optimizer', 'sgd', '--lr', '0.128', '--warmup-epochs', '2'])
    log = simulated_run(args, reaches_at_6)
    passed, report = checker(tmp_path / 'mlperf.log')
    assert passed and rule_files(report)[-1] == 'training_3.1.0/closed_resnet_sgd.yaml', report
    assert issue_rules(log) == []
    values = {line['key']: line['value'] for line in log}
    assert values['opt_name'] == 'sgd' and values['model_bn_span'] == 64 and 'lars_epsilon' not in values
    simulated_run(mlperf_args(tmp_path, ['--submission-division', 'open', '--wd', '3e-5']), reaches_at_6)
    passed, report = checker(tmp_path / 'mlperf.log')
    assert passed and 'training_4.0.0/open_resnet.yaml' in rule_files(report), report


@pytest.mark.unit
def test_every_key_of_the_log_is_one_the_rules_ask_for(good_log, tmp_path):
    """Nothing in the log is there for nothing: each key is named by a rule file the checker read, or is the seed."""
    folder = os.path.dirname(importlib.util.find_spec('mlperf_logging.compliance_checker').origin)
    asked = {'seed'}
    for name in rule_files(checker(tmp_path / 'mlperf.log')[1]):
        with open(os.path.join(folder, name)) as f:
            asked |= {record['KEY']['NAME'] for record in yaml.safe_load(f) if 'KEY' in record}
    assert {line['key'] for line in good_log} <= asked


@pytest.mark.unit
def test_runs_in_one_process_write_their_own_files_alone(tmp_path, capsys):
    """mllog.config(filename=...) adds a file handler to mllog's one shared logger at every call, so runs in one
    process (the tests run train.py in process) would write each other's files: each run writes through a logger of
    its own, to its file alone, and nothing to the standard output (where mllog's shared logger prints)."""
    first = mlperf_log.start(run_of(mlperf_args(tmp_path / 'a')), one_worker(), 3, resumed=False)
    second = mlperf_log.start(run_of(mlperf_args(tmp_path / 'b')), one_worker(), 3, resumed=False)
    first.epoch_start(0)
    second.epoch_start(5)
    first.run_stop()
    second.run_stop()
    for folder, epoch_num in (('a', 1), ('b', 6)):
        lines = parse_log(tmp_path / folder / 'mlperf.log')
        assert [line['key'] for line in lines].count('init_start') == 1
        assert [line['metadata']['epoch_num'] for line in lines if line['key'] == 'epoch_start'] == [epoch_num]
    assert capsys.readouterr().out == ''


def moved(lines, key, after):
    """`lines` with the first `key` line moved to just after the first `after` line (its time too)."""
    line = next(line for line in lines if line['key'] == key)
    rest = [other for other in lines if other is not line]
    index = next(i for i, other in enumerate(rest) if other['key'] == after) + 1
    return rest[:index] + [dict(line, time_ms=rest[index - 1]['time_ms'])] + rest[index:]


@pytest.mark.parametrize('key,after', [('init_stop', 'run_start'), ('init_start', 'init_stop'),
                                       ('run_start', 'run_stop'), ('eval_accuracy', 'run_stop'),
                                       ('epoch_start', 'epoch_stop'), ('init_start', 'run_start')])
@pytest.mark.unit
def test_a_key_out_of_order_fails(good_log, tmp_path, key, after):
    changed = moved(good_log, key, after)
    assert not checked(changed, tmp_path)[0] or issue_rules(changed)


@pytest.mark.parametrize('key,epoch_num', [('epoch_stop', 3), ('eval_stop', 3), ('eval_stop', 7), ('run_stop', None)])
@pytest.mark.unit
def test_an_interval_not_closed_fails(good_log, key, epoch_num):
    changed = [line for line in good_log if not (line['key'] == key and line['metadata'].get('epoch_num') == epoch_num)]
    assert len(changed) == len(good_log) - 1
    assert issue_rules(changed)


@pytest.mark.unit
def test_a_wrong_status_a_long_init_or_an_evaluation_off_the_period_fail(good_log, tmp_path):
    late = [dict(line, metadata=dict(line['metadata'], status='aborted')) if line['key'] == 'run_stop' else line
            for line in good_log]
    assert issue_rules(late)
    slow = [dict(line, time_ms=line['time_ms'] + 31 * 60 * 1000) if line['key'] != 'init_start' else line
            for line in good_log]
    passed, report = checked(slow, tmp_path)    # closed: init_stop within 30 minutes of the first init_start
    assert not passed and "CHECK for 'init_stop' failed" in report, report
    off = [dict(line, metadata=dict(line['metadata'], epoch_num=4)) if line['key'].startswith('eval') and
           line['metadata'].get('epoch_num') == 3 else line for line in good_log]
    assert issue_rules(off)


@pytest.mark.unit
def test_lines_name_the_hook_that_wrote_them(good_log):
    """metadata file and lineno: the call in the recipe (the simulated run here), not mlperf_log.py's own."""
    assert {line['metadata']['file'] for line in good_log} == {os.path.join('tests', 'test_mlperf_log.py')}


# ---- the flags and the rules checked before a run --------------------------------------------------------------

def check(*argv):
    args, origin = train.parse_flags(list(argv))
    fit.check_schedule_flags(args, origin)     # train.py's and the runner's check before anything starts
    return args


@pytest.mark.unit
def test_the_mlperf_recipe_writes_the_log_in_the_workspace_and_stops_at_the_target(tmp_path):
    args = check('--recipe', 'mlperf', '--workspace', str(tmp_path))
    assert (args.mlperf_log, args.target_accuracy) == ('mlperf.log', 0.759)
    assert mlperf_log.log_path(args.mlperf_log, Workspace.of(args)) == str(tmp_path / 'mlperf.log')
    assert (args.submission_org, args.submission_division, args.submission_status) == \
        ('unaffiliated', 'closed', 'onprem')
    assert check('--recipe', 'mlperf', '--mlperf-log', '/x/y.log').mlperf_log == '/x/y.log'
    off = check('--recipe', 'mlperf', '--mlperf-log', 'none', '--target-accuracy', '0.1')
    assert not mlperf_log.enabled(off.mlperf_log)
    assert not mlperf_log.enabled(check().mlperf_log)


@pytest.mark.parametrize('flag', ['--submission-org', '--submission-platform'])
@pytest.mark.unit
def test_submission_keys_are_never_empty(flag, capsys):
    with pytest.raises(SystemExit):
        train_args([flag, ' '])
    assert 'the compliance checker refuses it' in capsys.readouterr().err


@pytest.mark.parametrize('argv,said', [
    (['--mode', 'train'], '--mode train does not validate'),
    (['--benchmark-iters', '5'], '--benchmark-iters'),
    (['--no-metrics'], '--no-metrics'),
    (['--data-backend', 'synthetic'], '--data-backend synthetic'),
    (['--mlperf-log', 'm.log', '--recipe', 'nvidia', '--lr-schedule', 'poly', '--eval-period', '4', '--mom', '0.9',
      '--wd', '5e-5'], 'no --target-accuracy'),
    (['--begin-epoch', '3'], '--begin-epoch 3'),
    (['--teacher', 'x.params'], '--teacher'),
    (['--optimizer', 'lamb'], '--optimizer lamb'),
    (['--lr-schedule', 'cosine'], '--lr-schedule cosine'),
    (['--target-accuracy', '0.75'], '--target-accuracy 0.75'),
    (['--eval-period', '1'], '--eval-period 1'),
    (['--end-lr', '0.001'], '--end-lr 0.001'),
    (['--lr-poly-power', '1'], '--lr-poly-power 1'),
    (['--warmup-prefix', '0'], '--warmup-prefix 0'),
    (['--wd', '3e-5'], '--wd 3e-05'),
    (['--mom', '0.95'], '--mom 0.95'),
    (['--label-smoothing', '0.2'], '--label-smoothing 0.2'),
    (['--tta', 'flip'], '--tta flip'),
    (['--lars-eps', '1e-9'], '--lars-eps 1e-09'),
    (['--warmup-epochs', '0'], '--warmup-epochs 0'),
    (['--optimizer', 'sgd', '--warmup-epochs', '2.5'], '--warmup-epochs 2.5'),
    (['--optimizer', 'sgd', '--lr', '0.1234'], '--lr 0.1234'),
])
@pytest.mark.unit
def test_a_run_the_log_cannot_record_is_one_error_before_it_starts(argv, said):
    with pytest.raises(RecipeError, match='cannot record this run') as error:
        check('--recipe', 'mlperf', *argv)
    assert said in str(error.value) and '--mlperf-log none writes no log' in str(error.value)


@pytest.mark.unit
def test_closed_rules_do_not_bind_the_open_division_and_its_flags_alone_are_errors():
    check('--recipe', 'mlperf', '--submission-division', 'open', '--target-accuracy', '0.5', '--wd', '3e-5',
          '--eval-period', '1', '--warmup-prefix', '0')
    check('--recipe', 'mlperf', '--mom', '0.95', '--batch-size', '32768')    # LARS momentum is free from 32k images
    with pytest.raises(RecipeError, match='--optimizer lamb'):
        check('--recipe', 'mlperf', '--submission-division', 'open', '--optimizer', 'lamb')
    with pytest.raises(RecipeError, match='--submission-org fills an MLPerf result log, and this run writes none'):
        check('--submission-org', 'ACME')
    with pytest.raises(RecipeError, match='--mlperf-log fills an MLPerf result log, and training writes one, not '
                                          '--mode val'):
        check('--mode', 'val', '--mlperf-log', 'm.log')
    check('--recipe', 'mlperf', '--mode', 'val')     # the recipe's log is no flag given: val writes none, silently


@pytest.mark.unit
def test_a_log_evaluates_on_its_period_alone():
    """The recipe's extra validation after the last epoch is off the MLPerf period: a run with a result log does
    not make it (it could stop the clock at an epoch MLPerf would not evaluate)."""
    with_log = train_args(['--recipe', 'mlperf', '--num-epochs', '8'])
    without = train_args(['--recipe', 'mlperf', '--num-epochs', '8', '--mlperf-log', 'none'])
    assert [e for e in range(8) if fit.evaluated(with_log, e)] == [2, 6]
    assert [e for e in range(8) if fit.evaluated(without, e)] == [2, 6, 7]


@pytest.mark.unit
def test_a_resumed_run_or_weights_to_start_from_write_no_log(tmp_path, caplog):
    args = mlperf_args(tmp_path)
    result = mlperf_log.start(mlperf_log.Run.of(args, Workspace.of(args)), one_worker(), 3, resumed=True)
    result.epoch_start(5)
    result.run_stop()
    assert not (tmp_path / 'mlperf.log').exists() and 'writes no MLPerf result log' in caplog.text
    args = resolve.with_values(args, load=str(tmp_path / 'weights.params'))
    with pytest.raises(RecipeError, match='allow no pre-training'):
        mlperf_log.start(mlperf_log.Run.of(args, Workspace.of(args)), one_worker(), 3, resumed=False)


@pytest.mark.unit
def test_only_rank_0_writes(tmp_path):
    args = mlperf_args(tmp_path, ['--mlperf-log', str(tmp_path / 'rank1.log')])
    result = mlperf_log.start(mlperf_log.Run.of(args, Workspace.of(args)), one_worker(rank=1, size=2), 3, resumed=False)
    result.epoch_start(0)
    result.run_stop()
    assert not (tmp_path / 'rank1.log').exists()


@pytest.mark.unit
def test_a_log_that_cannot_be_written_is_one_error(tmp_path):
    (tmp_path / 'file').write_text('')
    args = mlperf_args(tmp_path, ['--mlperf-log', str(tmp_path / 'file' / 'mlperf.log')])
    with pytest.raises(RecipeError, match=r'--mlperf-log .*/file/mlperf.log: cannot write it'):
        mlperf_log.start(mlperf_log.Run.of(args, Workspace.of(args)), one_worker(), 3, resumed=False)


@pytest.mark.unit
def test_the_page_cache_is_dropped_where_allowed_and_said_where_not(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(mlperf_log, 'DROP_CACHES', str(tmp_path / 'drop_caches'))
    assert mlperf_log.drop_page_cache() is None and (tmp_path / 'drop_caches').read_text() == '3\n'
    assert mlperf_log.clear_cache('drop', one_worker()) is True
    monkeypatch.setattr(mlperf_log, 'DROP_CACHES', str(tmp_path / 'no' / 'such'))
    assert mlperf_log.clear_cache('drop', one_worker()) is False
    assert 'could not be dropped on 1 node(s)' in caplog.text and 'cache_clear false' in caplog.text
    assert (mlperf_log.clear_cache('done', one_worker()), mlperf_log.clear_cache('no', one_worker())) == (True, False)


# ---- real runs of the digits ----------------------------------------------------------------------------------

def run(digits, workspace, workers, extra, batch=32):
    argv = ['-n', str(workers), '-b', str(batch), '--data-root', str(digits / 'rec'), '--data-backend', 'dali-cpu',
            '--image-shape', '3,32,32', '--num-classes', '10', '--data-val-resize', '36', '--min-random-area', '0.5',
            '--num-layers', '10', '--workspace', str(workspace), '--dali-threads', '1', '--dali-validation-threads',
            '1', '--recipe', 'mlperf', '--mlperf-cache-clear', 'no', '--seed', '1'] + list(extra)
    if workers == 1:      # the runner and the train.py it starts in this process (conftest.runner_runs)
        result = runner_runs(*argv)
    else:
        result = subprocess.run([sys.executable, os.path.join(ROOT, 'runner')] + argv, capture_output=True,
                                text=True, env=RUN_ENV, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.integration
def test_a_closed_run_of_the_digits_reaches_the_target_and_its_log_passes(digits, tmp_path):
    """--recipe mlperf shortened to 3 epochs (ResNet-10 at 32x32, 1 worker, batch 64): validated after its third
    epoch only, at 84% top-1 (seed 1), past MLPerf's 75.9%: run_stop success, the time to train in report.json."""
    run(digits, tmp_path, 1, ['-e', '3', '--submission-org', 'ACME', '--submission-platform', 'laptop'], batch=64)
    passed, report = checker(tmp_path / 'mlperf.log')
    assert passed and rule_files(report) == CLOSED_LARS_RULES, report
    lines = parse_log(tmp_path / 'mlperf.log')
    assert issue_rules(lines) == []
    values = {line['key']: line['value'] for line in lines}
    assert (values['submission_org'], values['submission_platform']) == ('ACME', 'laptop')
    assert (values['train_samples'], values['eval_samples'], values['seed']) == (1438, 359, 1)
    assert [line['metadata']['epoch_num'] for line in lines if line['key'] == 'eval_accuracy'] == [3]
    assert {line['metadata']['file'] for line in lines} == {'fit.py'} and lines[-1]['metadata']['status'] == 'success'
    report = json.loads((tmp_path / 'report.json').read_text())
    assert report['summary']['mlperf.status'] == 'success'
    ttt = (lines[-1]['time_ms'] - keys_time(lines, 'run_start')) / 1000
    assert report['summary']['mlperf.time_to_train'] == pytest.approx(ttt) and 0 < ttt < report['total_duration']
    log = (tmp_path / 'log.log').read_text()
    assert 'run_stop success, time to train' in log and 'it is no closed result' in log


@HOROVOD
@pytest.mark.multiworker
def test_two_workers_write_one_log_evaluate_on_the_period_and_stop_at_the_target(digits, tmp_path):
    """--recipe mlperf (LARS, poly decay, evaluation every 4 epochs from epoch 2, closed division) on 2 workers of
    64 images, 4 epochs: rank 0 alone writes the log, which MLCommons' checker accepts; epochs 0 and 1 are not
    validated, epoch 2 (epoch_num 3) is and reaches MLPerf's 75.9% (83.6% top-1, seed 1), and the run stops there
    (no epoch 3), a success, with the time to it in report.json."""
    from rn50.reports import logs
    run(digits, tmp_path, 2, ['-e', '4'], batch=64)
    assert sorted(p.name for p in tmp_path.iterdir() if 'mlperf' in p.name) == ['mlperf.log']
    passed, report = checker(tmp_path / 'mlperf.log')
    assert passed and rule_files(report) == CLOSED_LARS_RULES, report
    lines = parse_log(tmp_path / 'mlperf.log')
    assert issue_rules(lines) == []
    values = {line['key']: line['value'] for line in lines}
    assert (values['submission_platform'], values['global_batch_size'], values['train_samples']) == ('2xCPU', 128, 1438)
    assert [line['metadata']['epoch_num'] for line in lines if line['key'] == 'epoch_stop'] == [1, 2, 3]
    assert [line['metadata']['epoch_num'] for line in lines if line['key'] == 'eval_accuracy'] == [3]
    assert lines[-1]['metadata']['status'] == 'success'
    epochs = [r for r in logs.read_dllogger(str(tmp_path / 'dllogger_log.log'))
              if isinstance(r['step'], list) and len(r['step']) == 1]
    assert [r['step'][0] for r in epochs] == [0, 1, 2]
    assert [r['step'][0] for r in epochs if 'val.accuracy' in r['data']] == [2]
    summary = json.loads((tmp_path / 'report.json').read_text())['summary']
    assert summary['target_accuracy.epoch'] == 2 and summary['target_accuracy.wall_seconds'] > 0
    assert 'Recipe mlperf: --optimizer lars' in (tmp_path / 'log.log').read_text()


@pytest.mark.integration
def test_a_resumed_run_leaves_the_first_parts_log_as_it_was(digits, tmp_path):
    """--run-epochs 1 ends the first invocation (run_stop aborted); the same command again resumes the state and
    writes nothing to the log, and says why."""
    argv = ['-e', '3', '--run-epochs', '1', '--num-examples', '128', '--submission-division', 'open',
            '--target-accuracy', '0.999']
    run(digits, tmp_path, 1, argv)
    first = (tmp_path / 'mlperf.log').read_text()
    assert parse_log(tmp_path / 'mlperf.log')[-1]['metadata']['status'] == 'aborted'
    result = run(digits, tmp_path, 1, argv)
    assert (tmp_path / 'mlperf.log').read_text() == first
    assert 'This run resumes a state' in result.stderr and 'writes no MLPerf result log' in result.stderr
    assert json.loads((tmp_path / 'report.json').read_text())['epochs'][-1]['epoch'] == 1
