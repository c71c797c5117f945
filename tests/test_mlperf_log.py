"""The MLPerf result log (mlperf_log.py) against MLCommons' rules: every line's format, the keys and values the
compliance checker's training 4.0.0 ruleset requires, their order, closed intervals, and the run rules of issue
39 (no log for a resumed run, evaluation on the period only, the stop at the target), on simulated runs and on
real ones of the digits with --recipe mlperf, on 1 and 2 workers.

The checker below is written here from the rules (mlcommons/logging, mlperf_logging/compliance_checker:
training_4.0.0/common.yaml, closed_common.yaml and open_common.yaml; closed_resnet.yaml as training_3.0.0 and
3.1.0 hold it, the index having no 4.0.0 copy; the lars and sgd keys as 0.7.0's resnet_lars.yaml and
resnet_sgd.yaml name them, with the constraints of the Training rules' hyper-parameter table), with the semantics
of its mlp_compliance.py: per rule file a fresh state, each line's CHECKs in order then its POST, the REQ counts
at the end, AT_LEAST_ONE_OR alternatives, ATLEAST_ONE_CHECK for at least one line, and rule files enqueued by
submission_division, submission_benchmark and opt_name."""
import json
import math
import os
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from conftest import ROOT, resolved, runner_runs, train_args

import fit
import train
from rn50.config import resolve
from rn50.errors import RecipeError
from rn50.reports import mlperf_log
from rn50.world import workers

HOROVOD = pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
RUN_ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' + os.environ['PATH'])
BENCHMARKS = ('resnet', 'ssd', 'stable_diffusion', 'maskrcnn', 'gpt3', 'dlrm_dcnv2', 'bert', 'rnnt', 'unet3d', 'gnn',
              'llama2_70b_lora')
FIELDS = ['namespace', 'time_ms', 'event_type', 'key', 'value', 'metadata']


# ---- the rules ---------------------------------------------------------------------------------------------------

def md(v):
    return v['metadata']


def power_of_two_times(value, base):
    exponent = math.log2(value / base) if value > 0 else 0.5
    return math.isclose(exponent, round(exponent), abs_tol=1e-9)


def rule(req=None, check=(), post=None, at_least_one=None):
    return {'req': req, 'check': list(check), 'post': post, 'at_least_one': at_least_one}


def init_stop_in_time(v, s, line):
    return line['time_ms'] - s['first_init_start'] < s['compile_time_mins'] * 60 * 1e3


def division_post(v, s, line, queue):
    queue.append(f'{v["value"]}_common')
    s['compile_time_mins'] = 240 if v['value'] == 'open' else 30


def init_start_post(v, s, line, queue):
    s['init_started'] = True
    s['first_init_start'] = min(s['first_init_start'], line['time_ms'])


ONE, ATLEAST = 'EXACTLY_ONE', 'AT_LEAST_ONE'
EPOCH_OR_SAMPLES = [lambda v, s, l: 'epoch_num' in md(v) or 'samples_count' in md(v)]
COMMON = {   # training_4.0.0/common.yaml
    'BEGIN': {'init_started': False, 'init_stopped': False, 'run_started': False, 'run_stopped': False,
              'first_init_start': 9e99, 'compile_time_mins': 0},
    'submission_org': rule(ONE, [lambda v, s, l: v['value'] != '']),
    'submission_platform': rule(ONE, [lambda v, s, l: v['value'] != '']),
    'submission_division': rule(ONE, [lambda v, s, l: v['value'] in ('closed', 'open')], post=division_post),
    'submission_status': rule(ONE, [lambda v, s, l: v['value'] in ('cloud', 'onprem', 'preview', 'research')]),
    'cache_clear': rule(ATLEAST, [lambda v, s, l: 'value' in v]),
    'init_start': rule(ATLEAST, [lambda v, s, l: not s['init_stopped'], lambda v, s, l: not s['run_started']],
                       post=init_start_post),
    'init_stop': rule(ONE, [lambda v, s, l: s['init_started'], lambda v, s, l: not s['run_started'], init_stop_in_time],
                      post=lambda v, s, l, q: s.update(init_stopped=True)),
    'run_start': rule(ONE, [lambda v, s, l: s['init_stopped']], post=lambda v, s, l, q: s.update(run_started=True)),
    'run_stop': rule(ONE, [lambda v, s, l: s['run_started'], lambda v, s, l: 'status' in md(v)],
                     post=lambda v, s, l, q: s.update(run_stopped=True)),
    'block_start': rule('OR epoch_start', [
        lambda v, s, l: s['run_started'], lambda v, s, l: 'epoch_count' in md(v) or 'samples_count' in md(v),
        lambda v, s, l: 'first_epoch_num' in md(v) if 'epoch_count' in md(v) else True,
        lambda v, s, l: md(v)['epoch_count'] > 0 if 'epoch_count' in md(v) else True]),
    'block_stop': rule('OR epoch_stop', [lambda v, s, l: 'first_epoch_num' in md(v) or 'samples_count' in md(v)]),
    'epoch_start': rule('OR block_start', [lambda v, s, l: 'epoch_num' in md(v)]),
    'epoch_stop': rule('OR block_stop', [lambda v, s, l: 'epoch_num' in md(v)]),
    'eval_start': rule('OR block_start', EPOCH_OR_SAMPLES),
    'eval_stop': rule('OR block_stop', EPOCH_OR_SAMPLES),
    'eval_accuracy': rule(ATLEAST, EPOCH_OR_SAMPLES),
    'train_samples': rule(ONE, [lambda v, s, l: v['value'] != '']),
    'eval_samples': rule(ONE, [lambda v, s, l: v['value'] != '']),
}
CLOSED_COMMON = {   # training_4.0.0/closed_common.yaml
    'submission_benchmark': rule(ONE, [lambda v, s, l: v['value'] in BENCHMARKS],
                                 post=lambda v, s, l, q: q.append(f'closed_{v["value"]}')),
    'gradient_accumulation_steps': rule(ONE, [lambda v, s, l: v['value'] > 0]),
}
OPEN_COMMON = {     # training_4.0.0/open_common.yaml (no open_resnet rules were found to add)
    'submission_benchmark': rule(ONE, [lambda v, s, l: v['value'] in BENCHMARKS],
                                 post=lambda v, s, l, q: q.append(f'open_{v["value"]}')),
}
CLOSED_RESNET = {   # closed_resnet.yaml
    'global_batch_size': rule(ONE, [lambda v, s, l: v['value'] > 0]),
    'opt_name': rule(ONE, [lambda v, s, l: v['value'] in ('sgd', 'lars')],
                     post=lambda v, s, l, q: q.append(f'closed_resnet_{v["value"]}')),
    'eval_accuracy': rule(ATLEAST, [lambda v, s, l: 'epoch_num' in md(v)],
                          at_least_one=lambda v: 0.759 <= v['value'] < 1.0),
}
CLOSED_RESNET_LARS = {   # the lars keys, each once, at the values the HP table allows (global batches < 32k here)
    'lars_opt_base_learning_rate': rule(ONE, [lambda v, s, l: v['value'] > 0]),
    'lars_opt_end_learning_rate': rule(ONE, [lambda v, s, l: v['value'] == 0.0001]),
    'lars_opt_learning_rate_decay_poly_power': rule(ONE, [lambda v, s, l: v['value'] == 2]),
    'lars_opt_learning_rate_decay_steps': rule(ONE, [lambda v, s, l: v['value'] > 0]),
    'lars_epsilon': rule(ONE, [lambda v, s, l: v['value'] == 0]),
    'lars_opt_learning_rate_warmup_epochs': rule(ONE, [lambda v, s, l: v['value'] > 0]),
    'lars_opt_momentum': rule(ONE, [lambda v, s, l: v['value'] == 0.9]),
    'lars_opt_weight_decay': rule(ONE, [lambda v, s, l: power_of_two_times(v['value'], 0.0001)]),
}
CLOSED_RESNET_SGD = {
    'sgd_opt_base_learning_rate': rule(ONE, [lambda v, s, l: math.isclose(v['value'] / 0.001,
                                                                          round(v['value'] / 0.001))]),
    'sgd_opt_end_learning_rate': rule(ONE, [lambda v, s, l: v['value'] == 0.0001]),
    'sgd_opt_learning_rate_decay_poly_power': rule(ONE, [lambda v, s, l: v['value'] == 2]),
    'sgd_opt_learning_rate_decay_steps': rule(ONE, [lambda v, s, l: v['value'] >= 0 and v['value'] == int(v['value'])]),
    'sgd_opt_weight_decay': rule(ONE, [lambda v, s, l: power_of_two_times(v['value'], 0.0001)]),
    'sgd_opt_momentum': rule(ONE, [lambda v, s, l: v['value'] == 0.9]),
    'model_bn_span': rule(ONE),
    'opt_learning_rate_warmup_epochs': rule(ONE, [lambda v, s, l: v['value'] >= 0 and v['value'] == int(v['value'])]),
}
CONFIGS = {'common': COMMON, 'closed_common': CLOSED_COMMON, 'open_common': OPEN_COMMON,
           'closed_resnet': CLOSED_RESNET, 'closed_resnet_lars': CLOSED_RESNET_LARS,
           'closed_resnet_sgd': CLOSED_RESNET_SGD, 'open_resnet': {}}


def compliance(lines):
    """The checker's messages for `lines` (parsed records): [] is its SUCCESS."""
    messages, queue = [], ['common']
    while queue:
        name = queue.pop(0)
        if name not in CONFIGS:
            messages.append(f'no rule file {name}')
            continue
        config = CONFIGS[name]
        state = dict(config.get('BEGIN', {}))
        counts = {key: 0 for key in config if key != 'BEGIN'}
        passed = {key: False for key in counts}
        for number, line in enumerate(lines):
            key = line['key']
            if key not in counts:
                continue
            counts[key] += 1
            v = {'value': line['value'], 'metadata': line['metadata']}
            spec = config[key]
            for test in spec['check']:
                try:
                    ok = test(v, state, line)
                except Exception as e:   # the checker reports a CHECK that cannot run as a failure
                    ok = False
                    messages.append(f'{name}: CHECK of {key} could not run: {e!r}')
                if not ok:
                    messages.append(f'{name}: CHECK of {key} failed in line {number}')
                    break
            if spec['post']:
                spec['post'](v, state, line, queue)
            if spec['at_least_one'] and spec['at_least_one'](v):
                passed[key] = True
        alternatives = set()
        for key, spec in ((k, s) for k, s in config.items() if k != 'BEGIN'):
            if spec['req'] == ONE and counts[key] != 1:
                messages.append(f'{name}: EXACTLY_ONE {key}, found {counts[key]}')
            if spec['req'] == ATLEAST and counts[key] < 1:
                messages.append(f'{name}: AT_LEAST_ONE {key}, found 0')
            if spec['req'] and spec['req'].startswith('OR '):
                alternatives.add(tuple(sorted({key, spec['req'][3:]})))
            if spec['at_least_one'] and not passed[key]:
                messages.append(f'{name}: no {key} passes its ATLEAST_ONE_CHECK')
        messages += [f'{name}: none of {alts}' for alts in alternatives if not any(counts[k] for k in alts)]
    return messages


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
    """The records of a result log, each line checked for MLCommons' format first."""
    records = []
    with open(path) as f:
        for line in f:
            assert line.startswith(':::MLLOG {') and line.endswith('}\n'), line
            record = json.loads(line[len(':::MLLOG '):])
            assert list(record) == FIELDS, record
            assert record['namespace'] == '' and isinstance(record['time_ms'], int), record
            assert record['event_type'] in ('POINT_IN_TIME', 'INTERVAL_START', 'INTERVAL_END'), record
            assert isinstance(record['key'], str) and record['key'], record
            where = record['metadata']
            assert os.path.isfile(os.path.join(ROOT, where['file'])) and where['lineno'] > 0, record
            records.append(record)
    return records


# ---- a run's log, written by the hooks fit.py calls, without training ---------------------------------------------

def mlperf_args(tmp_path, extra=()):
    """train.py's flags for --recipe mlperf, resolved as train.py resolves them for a CPU run."""
    return resolved(['--recipe', 'mlperf', '--workspace', str(tmp_path), '--seed', '3', '--batch-size', '64',
                     '--mlperf-cache-clear', 'no'] + list(extra))


def one_worker(rank=0, size=1):
    return types.SimpleNamespace(rank=rank, size=size, local_rank=rank, start_time=time.time(),
                                 devices=workers.Devices(),
                                 allreduce_sum=lambda values: np.asarray(values, dtype=np.float64) * size)


def simulated_run(args, accuracy, interrupt=None, world=None):
    """The hooks in fit.train's order, for a run whose validation gives accuracy(epoch); `interrupt`: the epoch a
    signal stops. Returns the records of the log."""
    result = mlperf_log.start(args, world or one_worker(), 3, resumed=False)
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
    return parse_log(mlperf_log.log_path(args))


def reaches_at_6(epoch):
    return 0.8 if epoch >= 6 else 0.5


@pytest.fixture
def good_log(tmp_path):
    return simulated_run(mlperf_args(tmp_path), reaches_at_6)


@pytest.mark.unit
def test_a_run_that_reaches_the_target_writes_a_log_the_rules_accept(good_log, tmp_path):
    assert compliance(good_log) == [] and issue_rules(good_log) == []
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
    assert mlperf_log.summary(mlperf_args(tmp_path)) == {
        'mlperf.log': str(tmp_path / 'mlperf.log'), 'mlperf.status': 'success',
        'mlperf.time_to_train': (good_log[-1]['time_ms'] - keys_time(good_log, 'run_start')) / 1000}


def keys_time(lines, key):
    return next(line['time_ms'] for line in lines if line['key'] == key)


@pytest.mark.unit
def test_a_run_that_misses_the_target_or_is_stopped_ends_aborted_with_every_interval_closed(tmp_path):
    missed = simulated_run(mlperf_args(tmp_path, ['--num-epochs', '8']), lambda epoch: 0.5)
    assert missed[-1]['metadata']['status'] == 'aborted' and issue_rules(missed) == []
    assert any('eval_accuracy' in m for m in compliance(missed))     # closed: no evaluation at 0.759 or more
    stopped = simulated_run(mlperf_args(tmp_path, ['--submission-division', 'open']), reaches_at_6, interrupt=4)
    assert [line['key'] for line in stopped[-3:]] == ['epoch_start', 'epoch_stop', 'run_stop']
    assert stopped[-1]['metadata']['status'] == 'aborted' and issue_rules(stopped) == [] and compliance(stopped) == []


@pytest.mark.unit
def test_the_sgd_keys_and_an_open_division(tmp_path):
    args = mlperf_args(tmp_path, ['--optimizer', 'sgd', '--lr', '0.128', '--warmup-epochs', '2'])
    log = simulated_run(args, reaches_at_6)
    assert compliance(log) == [] and issue_rules(log) == []
    values = {line['key']: line['value'] for line in log}
    assert values['opt_name'] == 'sgd' and values['model_bn_span'] == 64 and 'lars_epsilon' not in values
    open_log = simulated_run(mlperf_args(tmp_path, ['--submission-division', 'open', '--wd', '3e-5']), reaches_at_6)
    assert compliance(open_log) == []


@pytest.mark.parametrize('key', ['submission_org', 'submission_platform', 'submission_division', 'submission_status',
                                 'submission_benchmark', 'cache_clear', 'init_start', 'init_stop', 'run_start',
                                 'run_stop', 'epoch_start', 'epoch_stop', 'eval_start', 'eval_stop', 'eval_accuracy',
                                 'train_samples', 'eval_samples', 'global_batch_size', 'gradient_accumulation_steps',
                                 'seed', 'opt_name', 'lars_opt_base_learning_rate', 'lars_opt_end_learning_rate',
                                 'lars_opt_learning_rate_decay_poly_power', 'lars_opt_learning_rate_decay_steps',
                                 'lars_epsilon', 'lars_opt_learning_rate_warmup_epochs', 'lars_opt_momentum',
                                 'lars_opt_weight_decay'])
@pytest.mark.unit
def test_a_missing_key_fails(good_log, key):
    assert key in {line['key'] for line in good_log}
    assert compliance([line for line in good_log if line['key'] != key]) + \
        issue_rules([line for line in good_log if line['key'] != key])


@pytest.mark.unit
def test_every_key_of_the_log_is_one_the_rules_ask_for(good_log):
    """Nothing in the log is there for nothing: each key is in a rule file, or is the seed."""
    asked = {key for config in CONFIGS.values() for key in config} | {'seed'}
    assert {line['key'] for line in good_log} <= asked


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
def test_a_key_out_of_order_fails(good_log, key, after):
    changed = moved(good_log, key, after)
    assert compliance(changed) + issue_rules(changed)


@pytest.mark.parametrize('key,epoch_num', [('epoch_stop', 3), ('eval_stop', 3), ('eval_stop', 7), ('run_stop', None)])
@pytest.mark.unit
def test_an_interval_not_closed_fails(good_log, key, epoch_num):
    changed = [line for line in good_log if not (line['key'] == key and line['metadata'].get('epoch_num') == epoch_num)]
    assert len(changed) == len(good_log) - 1
    assert issue_rules(changed)


@pytest.mark.parametrize('key,value', [
    ('submission_org', ''), ('submission_platform', ''), ('submission_division', 'semi-open'),
    ('submission_status', 'home'), ('submission_benchmark', 'resnet50'), ('gradient_accumulation_steps', 0),
    ('global_batch_size', 0), ('opt_name', 'adam'), ('lars_opt_base_learning_rate', 0),
    ('lars_opt_end_learning_rate', 0.001), ('lars_opt_learning_rate_decay_poly_power', 1.0),
    ('lars_opt_learning_rate_decay_steps', 0), ('lars_epsilon', 1e-9), ('lars_opt_learning_rate_warmup_epochs', 0),
    ('lars_opt_momentum', 0.95), ('lars_opt_weight_decay', 3e-5), ('eval_accuracy', 1.0)])
@pytest.mark.unit
def test_a_value_outside_the_rules_fails(good_log, key, value):
    changed = [dict(line, value=value) if line['key'] == key else line for line in good_log]
    assert compliance(changed)


@pytest.mark.unit
def test_a_wrong_status_a_long_init_or_an_evaluation_off_the_period_fail(good_log):
    late = [dict(line, metadata=dict(line['metadata'], status='aborted')) if line['key'] == 'run_stop' else line
            for line in good_log]
    assert issue_rules(late)
    slow = [dict(line, time_ms=line['time_ms'] + 31 * 60 * 1000) if line['key'] != 'init_start' else line
            for line in good_log]
    assert compliance(slow)    # closed: init_stop within 30 minutes of the first init_start
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
    assert mlperf_log.log_path(args) == str(tmp_path / 'mlperf.log')
    assert (args.submission_org, args.submission_division, args.submission_status) == \
        ('unaffiliated', 'closed', 'onprem')
    assert check('--recipe', 'mlperf', '--mlperf-log', '/x/y.log').mlperf_log == '/x/y.log'
    assert not mlperf_log.enabled(check('--recipe', 'mlperf', '--mlperf-log', 'none', '--target-accuracy', '0.1'))
    assert not mlperf_log.enabled(check())


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
    result = mlperf_log.start(args, one_worker(), 3, resumed=True)
    result.epoch_start(5)
    result.run_stop()
    assert not (tmp_path / 'mlperf.log').exists() and 'writes no MLPerf result log' in caplog.text
    args = resolve.replaced(args, load=str(tmp_path / 'weights.params'))
    with pytest.raises(RecipeError, match='allow no pre-training'):
        mlperf_log.start(args, one_worker(), 3, resumed=False)


@pytest.mark.unit
def test_only_rank_0_writes(tmp_path):
    args = mlperf_args(tmp_path, ['--mlperf-log', str(tmp_path / 'rank1.log')])
    result = mlperf_log.start(args, one_worker(rank=1, size=2), 3, resumed=False)
    result.epoch_start(0)
    result.run_stop()
    assert not (tmp_path / 'rank1.log').exists()


@pytest.mark.unit
def test_the_page_cache_is_dropped_where_allowed_and_said_where_not(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(mlperf_log, 'DROP_CACHES', str(tmp_path / 'drop_caches'))
    assert mlperf_log.drop_page_cache() is None and (tmp_path / 'drop_caches').read_text() == '3\n'
    args = mlperf_args(tmp_path, ['--mlperf-cache-clear', 'drop'])
    assert mlperf_log.clear_cache(args, one_worker()) is True
    monkeypatch.setattr(mlperf_log, 'DROP_CACHES', str(tmp_path / 'no' / 'such'))
    assert mlperf_log.clear_cache(args, one_worker()) is False
    assert 'could not be dropped on 1 node(s)' in caplog.text and 'cache_clear false' in caplog.text
    assert mlperf_log.clear_cache(mlperf_args(tmp_path, ['--mlperf-cache-clear', 'done']), one_worker()) is True


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
    lines = parse_log(tmp_path / 'mlperf.log')
    assert compliance(lines) == [] and issue_rules(lines) == []
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
    """--recipe mlperf (LARS, poly decay, evaluation every 4 epochs from epoch 2) on 2 workers, 7 epochs of 128
    images, a target of 1% (open division): rank 0 alone writes the log; epochs 0 and 1 are not validated, epoch
    2 (epoch_num 3) is and reaches the target, and the run stops there (no epoch 3 to 6), a success, with the time
    to it in report.json."""
    from rn50.reports import logs
    run(digits, tmp_path, 2, ['-e', '7', '--num-examples', '128', '--submission-division', 'open',
                              '--target-accuracy', '0.01'], batch=16)
    assert sorted(p.name for p in tmp_path.iterdir() if 'mlperf' in p.name) == ['mlperf.log']
    lines = parse_log(tmp_path / 'mlperf.log')
    assert compliance(lines) == [] and issue_rules(lines, target=0.01) == []
    values = {line['key']: line['value'] for line in lines}
    assert (values['submission_platform'], values['global_batch_size'], values['train_samples']) == ('2xCPU', 32, 128)
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
