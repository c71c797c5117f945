"""End to end through train.py on the digits set: outputs, exact resume, signals, NaN, modes, workers."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rn50.checkpoints import checkpoint
from rn50.world import cpu
from rn50.reports import logs
from conftest import ROOT, built_once, copy_workspace, digits_flags, run_mode, train_main, two_gloo_workers

SMALL = ['--num-layers', '10', '--num-examples', '256', '--lr', '0.1', '--warmup-epochs', '1', '--seed', '3',
         '--disp-batches', '2']


def train_cmd(digits, workspace, *extra, batch=32):
    return [sys.executable, os.path.join(ROOT, 'train.py')] + digits_flags(digits, batch) + SMALL + \
        ['--workspace', str(workspace)] + [str(e) for e in extra]


def run(digits, workspace, *extra, check=True, batch=32):
    """train.py with train_cmd's flags: as a program, or in this process for val, pred and export (run_mode)."""
    return run_mode(*digits_flags(digits, batch), *SMALL, '--workspace', workspace, *extra, check=check)


def refused(digits, workspace, *extra, batch=32):
    """train.py's main in this process with run's flags, for a command refused before training (conftest.train_main)."""
    return train_main(*train_cmd(digits, workspace, *extra, batch=batch)[2:])


# conftest's trained_digits was trained at 24x24 and validated after a 28 resize: a mode using its weights says so.
TRAINED_SIZES = ['--image-shape', '3,24,24', '--data-val-resize', '28']


def epoch_records(workspace):
    return [r for r in logs.read_dllogger(os.path.join(workspace, 'dllogger_log.log'))
            if isinstance(r['step'], list) and len(r['step']) == 1]


def metrics_without_speed(records):
    return [logs.without_timings(r['data']) | {'epoch': r['step'][0]}
            for r in records]


@pytest.mark.integration
def test_train_val_outputs(digits, tmp_path):
    ws = tmp_path / 'ws'
    result = run(digits, ws, '--num-epochs', '2', '--save-frequency', '1', '--data-backend', 'mxnet')
    assert 'Iteration: 2 train.loss' in result.stdout and '(of 8 iterations, epoch ETA ' in result.stdout
    names = sorted(os.listdir(ws))
    assert names == ['classes.json', 'dllogger_log.log', 'log.log', 'model_0000.params', 'model_0001.params',
                     'model_best.params', 'model_last.state', 'model_prev.state', 'report.html', 'report.json',
                     'train_batch.jpg']
    records = logs.read_dllogger(str(ws / 'dllogger_log.log'))
    assert records[0]['step'] == 'PARAMETER' and records[0]['data']['batch_size'] == 32
    iterations = [r for r in records if isinstance(r['step'], list) and len(r['step']) == 2]
    assert [r['step'] for r in iterations[:2]] == [[0, 2], [0, 4]]
    assert set(iterations[0]['data']) == {'train.loss', 'train.ips', 'train.lr'}
    epochs = epoch_records(ws)
    assert len(epochs) == 2
    assert set(epochs[0]['data']) == {'train.loss', 'train.ips', 'val.loss', 'val.accuracy',
                                      'val.top_k_accuracy_5', 'val.ips', 'val.latency_avg', 'train.epoch_gap'}
    assert all(0 <= epoch['data']['train.epoch_gap'] < 60 for epoch in epochs)
    gaps = re.findall(r'\[Epoch (\d)\] ([0-9.]+) s between epochs besides validation', (ws / 'log.log').read_text())
    assert [(int(e), float(g)) for e, g in gaps] == [(e['step'][0], pytest.approx(e['data']['train.epoch_gap'],
                                                                                abs=0.01)) for e in epochs]
    assert records[-1]['step'] == [] and 'val.accuracy' in records[-1]['data']
    report = json.loads((ws / 'report.json').read_text())
    assert {'model', 'config', 'versions', 'hardware', 'epochs', 'total_duration', 'summary',
            'peak_memory_mb'} <= set(report)
    assert report['config']['lr'] == 0.1 and report['versions']['mxnet'] == '1.9.1'
    assert [e['epoch'] for e in report['epochs']] == [0, 1]
    assert 'Starting epoch 1' in (ws / 'log.log').read_text()
    meta = checkpoint.read_state(str(ws / 'model_last.state')).meta
    assert meta['epoch'] == 2 and meta['iteration'] == 0 and meta['seed'] == 3


@pytest.mark.parametrize('backend, stop_signal', [('dali-cpu', signal.SIGTERM), ('synthetic', signal.SIGINT)])
@pytest.mark.integration
def test_exact_resume_after_sigterm_or_ctrl_c(digits, tmp_path, backend, stop_signal):
    flags = ['--num-epochs', '2', '--data-backend', backend, '--mixup', '0.2']
    run(digits, tmp_path / 'whole', *flags)
    ws = tmp_path / 'parts'
    process = subprocess.Popen(train_cmd(digits, ws, *flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    log_file = ws / 'dllogger_log.log'
    while not (log_file.exists() and '"step": [0, 2]' in log_file.read_text()):
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0 and 'Stopped at epoch 0 iteration' in stderr and 'Traceback' not in stderr
    meta = checkpoint.read_state(str(ws / 'model_last.state')).meta
    assert meta['epoch'] == 0 and 0 < meta['iteration'] < 8
    result = run(digits, ws, *flags)
    assert 'Resuming from' in result.stderr
    assert metrics_without_speed(epoch_records(ws)) == metrics_without_speed(epoch_records(tmp_path / 'whole'))


def kill_once_logged(digits, workspace, flags, step='"step": [1, 2]'):
    """Start train.py in `workspace` and kill -9 it once its DLLogger file holds `step` and the state of the epoch
    before is on disk (it is written in the background while the next epoch trains); returns that file."""
    process = subprocess.Popen(train_cmd(digits, workspace, *flags), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    log_file, state = workspace / 'dllogger_log.log', workspace / 'model_last.state'
    while not (log_file.exists() and step in log_file.read_text() and state.exists()):
        assert process.poll() is None
        time.sleep(0.05)
    process.kill()                                   # no chance to save
    process.wait()
    return log_file


@pytest.mark.integration
def test_exact_resume_after_kill(digits, tmp_path):
    flags = ['--num-epochs', '2', '--data-backend', 'synthetic']
    run(digits, tmp_path / 'whole', *flags)
    ws = tmp_path / 'killed'
    log_file = kill_once_logged(digits, ws, flags)     # in epoch 1: resume from the end of epoch 0
    assert 'Resuming from' in run(digits, ws, *flags).stderr
    resumed = [r for r in metrics_without_speed(epoch_records(ws))]
    whole = metrics_without_speed(epoch_records(tmp_path / 'whole'))
    assert resumed == whole and [r['epoch'] for r in resumed] == [0, 1]
    steps = [r['step'] for r in logs.read_dllogger(str(log_file)) if isinstance(r['step'], list)]
    assert len(steps) == len({tuple(s) for s in steps})        # the killed run's epoch-1 records superseded


@pytest.mark.unit
def test_val_refuses_a_missing_workspace_and_random_weights(digits, tmp_path):
    result = refused(digits, tmp_path / 'mistyped', '--mode', 'val')
    assert result.returncode == 2 and 'does not exist' in result.stderr and not (tmp_path / 'mistyped').exists()
    (tmp_path / 'empty').mkdir()
    result = refused(digits, tmp_path / 'empty', '--mode', 'val')
    assert result.returncode == 2 and 'refuses to run on random weights' in result.stderr


@pytest.mark.integration
def test_val_evaluates_a_checkpoint_without_training_data(digits, trained_digits, tmp_path):
    ws = trained_digits
    flags = digits_flags(digits) + TRAINED_SIZES
    no_train = [x for i, x in enumerate(flags) if not (x.startswith('--data-train') or
                                                       (i and flags[i - 1].startswith('--data-train')))]
    run_mode(*no_train, *SMALL, '--workspace', tmp_path / 'eval', '--mode', 'val', '--load', ws / 'model_best.params',
             '--data-backend', 'mxnet')
    passes = epoch_records(tmp_path / 'eval')
    assert len(passes) == 1                         # one pass by default, and no training data needed
    best = max(r['data']['val.accuracy'] for r in epoch_records(ws))     # model_best.params's epoch
    assert passes[0]['data']['val.accuracy'] == pytest.approx(best)
    assert {'val.latency_50', 'val.latency_99', 'val.latency_100'} <= set(passes[0]['data'])


@pytest.fixture
def one_epoch(digits, tmp_path_factory, tmp_path):
    """A copy of the workspace of `run(..., '--num-epochs', '1', '--data-backend', 'synthetic')`, trained once for
    the whole run (the start of each test below, which continue or repeat it in place)."""
    source = built_once(tmp_path_factory, 'test_train-one-synthetic-epoch',
                        lambda workspace: run(digits, workspace, '--num-epochs', '1', '--data-backend', 'synthetic'))
    return copy_workspace(source, tmp_path / 'ws')


@pytest.mark.integration
def test_nan_loss_stops_with_clear_error_and_keeps_last_good_state(digits, one_epoch):
    ws = one_epoch
    before = (ws / 'model_last.state').read_bytes()
    result = run(digits, ws, '--num-epochs', '2', '--data-backend', 'synthetic', '--lr', '1e30', '--load',
                 ws / 'model_last.state', check=False)     # a .state named by --load: resumed with these settings
    assert result.returncode == 2
    assert 'the training loss became nan at epoch 1 iteration' in result.stderr
    assert (ws / 'model_last.state').read_bytes() == before


@pytest.mark.integration
def test_diverged_parameters_never_overwrite_checkpoints(digits, one_epoch):
    """A huge learning rate can leave the loss finite while the weights turn NaN: the run stops with a clear
    error naming the epoch, and the last good state and best weights stay as they were."""
    ws = one_epoch
    before = {name: (ws / name).read_bytes() for name in ('model_last.state', 'model_best.params')}
    result = run(digits, ws, '--num-epochs', '2', '--data-backend', 'synthetic', '--lr', '1e6', '--warmup-epochs',
                 '0', '--load', ws / 'model_last.state', check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    assert 'NaN or infinite' in result.stderr or 'training loss became' in result.stderr
    assert 'epoch 1' in result.stderr.splitlines()[-1]
    assert {name: (ws / name).read_bytes() for name in before} == before
    assert not (ws / 'model_prev.state').exists() or checkpoint.read_state(str(ws / 'model_prev.state'))


@pytest.mark.integration
def test_test_io_reports_images_per_second(digits, tmp_path):
    result = run(digits, tmp_path / 'io', '--test-io', '--data-backend', 'dali-cpu')
    summary = logs.read_dllogger(str(tmp_path / 'io' / 'dllogger_log.log'))[-1]
    assert summary['step'] == [] and summary['data']['train.ips'] > 0
    assert 'train.ips' in result.stdout


@pytest.mark.unit
def test_bad_flags_are_clear_errors(digits, tmp_path):
    result = refused(digits, tmp_path / 'a', '--gpus', '0')
    if result.returncode == 2:
        assert 'asks for GPUs this machine does not have' in result.stderr
    result = refused(digits, tmp_path / 'b', '--batch-size', '30', '--kv-store', 'device', '--data-train',
                     str(tmp_path / 'missing.rec'))
    assert result.returncode == 2 and 'not found' in result.stderr and 'Traceback' not in result.stderr


@pytest.mark.integration
def test_amp_is_bfloat16_on_cpu_or_a_clear_error(digits, tmp_path):
    result = run(digits, tmp_path / 'amp', '--amp', '--num-epochs', '1', '--data-backend', 'synthetic',
                 check=False)
    if set(cpu.cpuinfo_field('flags').split()) & {'avx512f', 'avx512_bf16', 'amx_bf16'}:
        assert result.returncode == 0, result.stderr[-2000:]
    else:
        assert result.returncode == 2 and 'needs an AVX-512 CPU' in result.stderr


def horovod_workers(root):
    """The train.py processes horovodrun started below `root` (a psutil.Process)."""
    return [p for p in root.children(recursive=True)
            if len(p.cmdline()) > 1 and p.cmdline()[1].endswith('train.py')]


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.multiworker
def test_two_workers_follow_one_worker_and_resume_exactly(digits, tmp_path):
    """Synthetic data gives worker r slice r of one global batch, so 1 and 2 workers see the same global
    batches; only batchnorm statistics (per worker) and summation order differ. Each worker keeps its own
    batchnorm statistics (no sync BN): a resumed 2-worker run must restore every worker's, and the epoch's loss
    sums of both, to match the uninterrupted run exactly."""
    import psutil
    flags = ['--num-epochs', '2', '--data-backend', 'synthetic', '--kv-store', 'horovod', '--disp-batches', '1',
             '--label-smoothing', '0']
    env = dict(os.environ, OMP_NUM_THREADS='1')
    run(digits, tmp_path / 'one', *flags, '--kv-store', 'device')      # one worker: in this process
    whole = subprocess.run(two_gloo_workers(*train_cmd(digits, tmp_path / 'whole', *flags)),
                           capture_output=True, text=True, env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    one = [r['data']['train.loss'] for r in epoch_records(tmp_path / 'one')]
    two = [r['data']['train.loss'] for r in epoch_records(tmp_path / 'whole')]
    assert len(two) == 2
    assert two == pytest.approx(one, rel=0.1)       # same trajectory within 10%
    assert one[-1] < one[0] and two[-1] < two[0]
    ws = tmp_path / 'parts'
    launcher = subprocess.Popen(two_gloo_workers(*train_cmd(digits, ws, *flags)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    log_file = ws / 'dllogger_log.log'
    while not (log_file.exists() and '"step": [0, 2]' in log_file.read_text()):
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        time.sleep(0.05)
    for worker in horovod_workers(psutil.Process(launcher.pid)):
        worker.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr[-3000:]
    meta = checkpoint.read_state(str(ws / 'model_last.state')).meta
    assert meta['epoch'] == 0 and 0 < meta['iteration'] < 4 and meta['workers'] == 2
    resumed = subprocess.run(two_gloo_workers(*train_cmd(digits, ws, *flags)),
                             capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert metrics_without_speed(epoch_records(ws)) == metrics_without_speed(epoch_records(tmp_path / 'whole'))
    # The workers are on cpu(0) and cpu(1), as on gpu(0) and gpu(1): after the resume both hold the same model,
    # optimizer step counts included (rank 1's used to restart from none).
    assert resumed.stderr.count('All 2 workers hold the same weights, batchnorm statistics and optimizer') == 2


@pytest.mark.integration
def test_predict_image_and_folder(digits, trained_digits, tmp_path):
    trained = copy_workspace(trained_digits, tmp_path / 'trained')
    folder = tmp_path / 'images'
    (folder / 'more').mkdir(parents=True)
    for name in ('a.jpg', 'more/b.jpg'):          # subfolders are looked into
        shutil.copy(next((digits / 'images' / 'val' / 'digit_3').iterdir()), folder / name)
    (folder / 'c.png').write_bytes(b'not a png')
    output = tmp_path / 'pred.json'
    result = run(digits, trained, '--mode', 'pred', '--data-pred', folder, '--pred-output', output, '--topk', '3',
                 *TRAINED_SIZES)
    assert 'cannot read image' in result.stderr and 'c.png' in result.stderr
    assert result.stdout.count('%') == 6 and ' 1. ' in result.stdout
    assert 'DLL' not in result.stdout                # stdout holds the predictions alone
    alone = refused(digits, trained, '--mode', 'pred', '--data-pred', folder / 'c.png', *TRAINED_SIZES)
    assert alone.returncode == 2 and alone.stderr.count('cannot read image') == 1
    predictions = json.loads(output.read_text())
    assert predictions['checkpoint'].endswith('model_best.params')
    by_image = {os.path.basename(p['image']): p for p in predictions['predictions']}
    assert 'error' in by_image['c.png']
    top = by_image['a.jpg']['top']
    assert len(top) == 3 and sum(t['probability'] for t in top) <= 1.0001
    assert top[0]['probability'] >= top[1]['probability']
    names = {'zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine'}
    assert {t['name'] for t in top} <= names        # from the classes.json next to the data
    assert by_image['a.jpg']['top'] == by_image['b.jpg']['top']


@pytest.mark.integration
def test_finetuning_from_a_checkpoint_of_other_classes(digits, trained_digits, tmp_path):
    weights = trained_digits / 'model_best.params'
    flags = ['--load', weights, '--num-classes', '2', '--data-backend', 'synthetic', '--num-epochs', '1']
    without = refused(digits, tmp_path / 'refused', *flags)
    assert without.returncode == 2 and '10-class classifier, the network 2 classes' in without.stderr
    result = run(digits, tmp_path / 'tuned', *flags, '--finetune', '--backbone-lr-mult', '0.1')
    assert 'classifier left out for a new one (10 -> 2 classes)' in result.stderr
    assert [r['step'] for r in epoch_records(tmp_path / 'tuned')] == [[0]]       # a new run: epoch 0
    meta = checkpoint.read_state(str(tmp_path / 'tuned' / 'model_last.state')).meta
    assert meta['preprocessing']['rgb_mean'] == [123.68, 116.779, 103.939]


@pytest.mark.integration
def test_load_over_an_interrupted_run_resumes_it(digits, trained_digits, tmp_path):
    """The same command after an interruption continues the run, with --load of weights as without; only
    --load of a .state resumes that state instead."""
    flags = ['--load', trained_digits / 'model_best.params', '--data-backend', 'synthetic', '--num-epochs', '2']
    run(digits, tmp_path / 'w', *flags, '--run-epochs', '1')
    again = run(digits, tmp_path / 'w', *flags)
    assert 'Resuming from' in again.stderr and 'wins over --load' in again.stderr
    assert [r['step'] for r in epoch_records(tmp_path / 'w')] == [[0], [1]]   # epoch 0 is not trained again


@pytest.mark.unit
def test_predict_refuses_random_weights(digits, tmp_path):
    image = next((digits / 'images' / 'val' / 'digit_1').iterdir())
    (tmp_path / 'nothing').mkdir()
    result = refused(digits, tmp_path / 'nothing', '--mode', 'pred', '--data-pred', image)
    assert result.returncode == 2 and 'refuses to run on random weights' in result.stderr


@pytest.mark.integration
def test_training_report_survives_other_modes_and_adds_up_resumes(digits, tmp_path):
    ws = tmp_path / 'run'
    run(digits, ws, '--num-epochs', '2', '--run-epochs', '1', '--data-backend', 'synthetic')
    first = json.loads((ws / 'report.json').read_text())['total_duration']
    result = run(digits, ws, '--num-epochs', '2', '--data-backend', 'synthetic')
    second_process = float(result.stderr.split('Done in ')[1].split(' s')[0])
    report = json.loads((ws / 'report.json').read_text())
    assert [e['epoch'] for e in report['epochs']] == [0, 1]
    assert report['total_duration'] > first + 0.5 * second_process     # both processes, not the last alone
    run(digits, ws, '--mode', 'val', '--data-backend', 'synthetic')
    assert json.loads((ws / 'report.json').read_text()) == report
    assert json.loads((ws / 'report_val.json').read_text())['mode'] == 'val'


@pytest.mark.integration
def test_a_measurement_measures_afresh_and_writes_no_state(digits, tmp_path):
    """--benchmark-iters runs in one folder (a sweep, benchmark.py rerun) each train and report their own
    figures; none resumes the other's state, and none leaves checkpoints behind."""
    flags = ['--benchmark-iters', '2', '--num-epochs', '1', '--data-backend', 'synthetic', '--disp-batches', '1']
    for batch in (16, 32):
        result = run(digits, tmp_path / 'w', *flags, batch=batch)
        assert 'Iteration: 2 train.loss' in result.stdout, result.stderr[-2000:]
    assert not [name for name in os.listdir(tmp_path / 'w') if name.endswith(('.state', '.params'))]


@pytest.mark.integration
def test_a_workspace_resumes_only_its_own_run(digits, one_epoch):
    ws = one_epoch
    finished = refused(digits, ws, '--num-epochs', '1', '--data-backend', 'synthetic')     # nothing to train
    assert finished.returncode == 0 and 'This run is finished (1 of 1 epochs)' in finished.stderr
    other = refused(digits, ws, '--num-epochs', '2', '--mixup', '0.2', '--end-lr', '0.001', '--data-backend',
                    'synthetic')
    assert other.returncode == 2 and 'Traceback' not in other.stderr, other.stderr[-2000:]
    error = other.stderr.strip().splitlines()[-1]
    assert error.startswith('error: ') and '--num-epochs 1 in the saved run, 2 now' in error and '--mixup 0' in error
    assert '--end-lr 0.0001 in the saved run, 0.001 now' in error
    assert checkpoint.read_state(str(ws / 'model_last.state')).meta['epoch'] == 1     # nothing replaced


@pytest.mark.parametrize('flags,message', [
    (['--load', 'nosuch.safetensors'], 'error: --load nosuch.safetensors: no such file'),
    (['--finetune'], 'error: --finetune fine-tunes the weights of --load, and none was given')])
@pytest.mark.unit
def test_a_start_without_its_weights_is_one_error_and_writes_nothing(digits, tmp_path, flags, message):
    """--finetune without --load trained from scratch without a word; a missing --load file left log.log and
    dllogger_log.log behind, without the error in them."""
    result = refused(digits, tmp_path / 'ws', *flags)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith(message)
    assert not (tmp_path / 'ws').exists() or os.listdir(tmp_path / 'ws') == []


@pytest.mark.integration
def test_an_epoch_shorter_than_disp_batches_still_logs_its_learning_rate(digits, tmp_path):
    run(digits, tmp_path, '--num-examples', '64', '--num-epochs', '1', '--mode', 'train', '--warmup-epochs', '0')
    records = [r for r in logs.read_dllogger(str(tmp_path / 'dllogger_log.log'))
               if isinstance(r['step'], list) and len(r['step']) == 2]
    assert [r['step'] for r in records] == [[0, 2]] and 'train.lr' in records[0]['data']
