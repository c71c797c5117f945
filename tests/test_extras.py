"""The features of timm and torchvision (ema.py, tensorboard_log.py, CutMix in losses.py, accumulation in step.py):
unit tests on small networks, then end to end through train.py on the digits set."""
import json
import os
import shutil
import subprocess
import threading
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import pytest

from rn50.checkpoints import checkpoint
from rn50.checkpoints.workspace import Workspace
from rn50.training import ema
from rn50.training import losses
from rn50.reports import tensorboard_log
import train
from rn50.world import workers
from conftest import run_script, runner_main
from float16_twin import Float16Net, batch_of, step_for
from test_train import epoch_records, kill_once_logged, metrics_without_speed, refused, run, train_cmd


# ---- CutMix -----------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_cutmix_box_is_clipped_and_targets_mixed_by_the_pasted_area():
    boxes = [tuple(losses.cutmix_boxes(1, 0, i, 0, 0, 1, 8, 6, 1.0)[0][0]) for i in range(50)]
    kept = [losses.cutmix_boxes(1, 0, i, 0, 0, 1, 8, 6, 1.0)[1][0] for i in range(50)]
    assert boxes[3] == tuple(losses.cutmix_boxes(1, 0, 3, 0, 0, 1, 8, 6, 1.0)[0][0])   # a function of the position
    assert len(set(boxes)) > 10
    for (top, bottom, left, right), share in zip(boxes, kept):
        assert 0 <= top <= bottom <= 8 and 0 <= left <= right <= 6
        assert share == pytest.approx(1 - (bottom - top) * (right - left) / 48)
    assert any(share > 0.99 for share in kept) or any(b[0] == 0 or b[1] == 8 for b in boxes)
    for layout in ('NCHW', 'NHWC'):
        images = mx.nd.array(np.arange(2).reshape(2, 1, 1, 1) * np.ones((2, 1, 4, 4)))   # image 0: 0s, 1: 1s
        if layout == 'NHWC':
            images = images.transpose((0, 2, 3, 1))
        targets = losses.smoothed_one_hot(mx.nd.array([0, 1]), 2, 0.0)
        mixed, mixed_targets = losses.mix(images, targets, np.array([0.5, 0.5], np.float32),
                                          np.array([[1, 3, 0, 4]] * 2), layout)
        first = mixed.asnumpy()[0].reshape(4, 4)
        np.testing.assert_array_equal(first, [[0] * 4, [1] * 4, [1] * 4, [0] * 4])   # rows 1-2 pasted from image 1
        np.testing.assert_allclose(mixed_targets.asnumpy(), [[0.5, 0.5], [0.5, 0.5]])


@pytest.mark.unit
def test_switch_prob_chooses_cutmix_per_batch():
    draws = [losses.cutmix_uses(1, 0, i, 0, 0, 0.3) for i in range(2000)]
    assert 0.25 < np.mean(draws) < 0.35
    assert not any(losses.cutmix_uses(1, 0, i, 0, 0, 0.0) for i in range(100))


@pytest.mark.unit
def test_training_step_pastes_boxes_with_cutmix():
    step = step_for(Float16Net(), extra=['--cutmix', '1.0', '--mixup-mode', 'batch'])
    images = mx.nd.array(np.random.default_rng(0).normal(size=(8, 4, 6, 6)))
    mixed, targets = step.inputs_and_targets(images, mx.nd.array([0, 1, 2, 0, 1, 2, 0, 1]), 0, 3, 0)
    (top, bottom, left, right), kept = (value[0] for value in losses.cutmix_boxes(1, 0, 3, 0, 0, 1, 6, 6, 1.0))
    np.testing.assert_array_equal(mixed.asnumpy()[0, :, top:bottom, left:right],
                                  images.asnumpy()[7, :, top:bottom, left:right])
    assert targets.asnumpy()[0, 0] == pytest.approx(kept * (0.9 + 0.1 / 3) + (1 - kept) * 0.1 / 3, rel=1e-5)


# ---- gradient accumulation --------------------------------------------------------------------------------

@pytest.mark.unit
def test_accumulated_micro_batches_update_as_one_large_batch():
    """Without batchnorm a network cannot tell 2 batches of 8 from one of 16: after each step of
    --grad-accum-steps 2 the weights equal those of batch 16, the second micro-batch alone steps, and the
    learning rate is the one of the group's first batch."""
    rng = np.random.default_rng(2)
    images, labels = rng.normal(size=(64, 4, 2, 2)), rng.integers(0, 3, 64)
    mx.random.seed(5)
    large = step_for(Float16Net(batchnorm=False), batch=16)
    mx.random.seed(5)
    small = step_for(Float16Net(batchnorm=False), batch=8, extra=['--grad-accum-steps', '2'])
    small.accumulation.start_epoch(8)
    for i in range(4):
        large.run(batch_of(images[16 * i:16 * i + 16], labels[16 * i:16 * i + 16]), 0, i, 0.5)
        before = small.net.weight.data().asnumpy().copy()
        small.run(batch_of(images[16 * i:16 * i + 8], labels[16 * i:16 * i + 8]), 0, 2 * i, 0.5)
        np.testing.assert_array_equal(small.net.weight.data().asnumpy(), before)      # no step yet
        small.run(batch_of(images[16 * i + 8:16 * i + 16], labels[16 * i + 8:16 * i + 16]), 0, 2 * i + 1, 0.5)
        np.testing.assert_allclose(small.net.weight.data().asnumpy(), large.net.weight.data().asnumpy(),
                                   rtol=1e-5, atol=1e-6)
    assert small.accumulation.group_start(5) == 4 and small.accumulation.at_step(6)


@pytest.mark.unit
def test_an_overflow_in_one_micro_batch_skips_the_whole_step():
    step = step_for(Float16Net(batchnorm=False), 'float16', extra=['--grad-accum-steps', '2'])
    step.loss_scale = losses.DynamicLossScale(scale=8.0)
    step.accumulation.start_epoch(4)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)
    bad = images.copy()
    bad[0, 0, 0, 0] = np.inf
    before = step.net.weight.data().asnumpy().copy()
    step.run(batch_of(bad, labels, 'float16'), 0, 0, 0.5)
    step.run(batch_of(images, labels, 'float16'), 0, 1, 0.5)
    np.testing.assert_array_equal(step.net.weight.data().asnumpy(), before)
    assert step.loss_scale.skipped == 1 and step.loss_scale.scale == 4.0
    step.run(batch_of(images, labels, 'float16'), 0, 2, 0.5)                  # the zeroed sum starts clean
    step.run(batch_of(images, labels, 'float16'), 0, 3, 0.5)
    assert step.loss_scale.skipped == 1 and not np.array_equal(step.net.weight.data().asnumpy(), before)


@pytest.mark.unit
def test_runner_scales_the_learning_rate_by_the_effective_batch():
    def lr(*argv):
        result = runner_main('--dry-run', '--data-backend', 'synthetic', *argv)
        assert result.returncode == 0, result.stderr
        words = result.stdout.split()
        return float(words[words.index('--lr') + 1])
    assert lr('-n', '1', '-b', '192', '--grad-accum-steps', '8') == lr('-n', '8', '-b', '192') == 1.536


# ---- the weight average -----------------------------------------------------------------------------------

@pytest.mark.unit
def test_weight_average_follows_the_weights_and_swaps_in_and_out():
    mx.random.seed(1)
    step = step_for(Float16Net(), 'float16')
    average = ema.WeightAverage(step.net, 0.5, mx.cpu())
    start = step.net.weight.data().asnumpy().astype(np.float32)
    rng = np.random.default_rng(0)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), 'float16'), 0, 0, 0.5)
    average.update(1)
    trained = step.net.weight.data().asnumpy().astype(np.float32)
    assert average.average['weight'].dtype == np.float32
    np.testing.assert_allclose(average.average['weight'].asnumpy(), 0.5 * start + 0.5 * trained, rtol=1e-6)
    mean = step.net.bn.running_mean.data().asnumpy()
    assert not np.allclose(mean, 0)                                           # batchnorm statistics too
    np.testing.assert_allclose(average.average['bn.running_mean'].asnumpy(), 0.5 * mean, rtol=1e-6)
    with average.swapped_in():
        np.testing.assert_allclose(step.net.weight.data().asnumpy(), 0.5 * start + 0.5 * trained, rtol=1e-3)
    np.testing.assert_array_equal(step.net.weight.data().asnumpy().astype(np.float32), trained)
    copy = ema.WeightAverage(step.net, 0.5, mx.cpu())
    assert copy.restore(average.state_arrays())
    np.testing.assert_array_equal(copy.average['weight'].asnumpy(), average.average['weight'].asnumpy())


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.unit
def test_the_average_every_n_steps_with_warm_up_follows_the_formula(dtype):
    """--model-ema-steps 3 --model-ema-warmup over 7 steps, against the formula written out here: after steps 3
    and 6 only, a = d * a + (1 - d) * w with d = min(0.9, 1 - (1 + step)^(-2/3)) ** 3 (float16 weights go
    through the mixed-precision kernel; the network's own weights are never written)."""
    mx.random.seed(1)
    step = step_for(Float16Net(), dtype)
    step.average = ema.WeightAverage(step.net, 0.9, mx.cpu(), every=3, warmup=True)
    step.accumulation.start_epoch(7)
    expected = {name: p.data().asnumpy().astype(np.float64) for name, p in step.net._collect_params_with_prefix().items()}
    rng = np.random.default_rng(0)
    for iteration in range(7):
        step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, iteration, 0.5)
        number = iteration + 1
        if number % 3 == 0:
            decay = min(0.9, 1 - (1 + number) ** (-2 / 3)) ** 3
            for name, p in step.net._collect_params_with_prefix().items():
                expected[name] = decay * expected[name] + (1 - decay) * p.data().asnumpy().astype(np.float64)
    assert step.accumulation.step_number(0, 6) == 7
    for name, value in expected.items():
        np.testing.assert_allclose(step.average.average[name].asnumpy(), value, rtol=2e-5, atol=1e-6)


@pytest.mark.unit
def test_torchvisions_adjusted_decay():
    args = train.build_parser().parse_args(['--model-ema', '--model-ema-decay', '0.99998', '--model-ema-steps',
                                            '32', '--model-ema-adjust', '--batch-size', '1024', '--num-epochs',
                                            '600'])
    assert ema.Averaging.of(args).adjusted_decay() == pytest.approx(1 - 2e-5 * 1024 * 32 / 600)
    args.model_ema_decay, args.num_epochs = 0.9998, 1
    assert ema.Averaging.of(args).adjusted_decay() == 0       # alpha capped at 1: the average is the weights


class TwoWorkers(workers.Communicator):
    """A stand-in for the collectives of rank 1 of 2 whose rank 0 holds batchnorm statistics 1 larger."""

    def gather(self, row):
        return np.stack([row + 1, row])


@pytest.mark.unit
def test_every_worker_resumes_its_own_averaged_batchnorm_statistics():
    mx.random.seed(1)
    step = step_for(Float16Net())
    average = ema.WeightAverage(step.net, 0.5, mx.cpu())
    average.average['bn.running_mean'][:] = 0.25
    arrays = ema.average_state(average, step.net, workers.World(rank=1, size=2, comm=TwoWorkers(rank=1, size=2)))
    assert arrays['ema:rank0:bn.running_mean'].asnumpy() == pytest.approx([1.25] * 4)
    resumed = ema.WeightAverage(step.net, 0.5, mx.cpu())
    assert resumed.restore(arrays, rank=1)
    assert resumed.average['bn.running_mean'].asnumpy() == pytest.approx([0.25] * 4)
    assert resumed.restore(arrays, rank=0)
    assert resumed.average['bn.running_mean'].asnumpy() == pytest.approx([1.25] * 4)


# ---- flags ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('flag', [['--grad-accum-steps', '0'], ['--keep-checkpoints', '-1'],
                                  ['--target-accuracy', '1.5'], ['--target-accuracy', '0'],
                                  ['--model-ema-decay', '1.1'], ['--model-ema-steps', '0'], ['--cutmix', '-1'],
                                  ['--mixup-switch-prob', '2']])
@pytest.mark.unit
def test_new_flags_are_range_checked(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_flags(flag)[0]
    assert exit_info.value.code == 2 and 'out of range' in capsys.readouterr().err


@pytest.mark.unit
def test_tensorboard_flag_defaults_to_the_workspace_folder():
    parser = train.build_parser()
    assert parser.parse_args(['--tensorboard']).tensorboard == 'tensorboard'
    assert parser.parse_args(['--tensorboard', 'tb']).tensorboard == 'tb'
    assert parser.parse_args([]).tensorboard is None


# ---- end to end on the digits set -------------------------------------------------------------------------

@pytest.mark.integration
def test_keep_checkpoints_keeps_the_newest(digits, tmp_path):
    ws = tmp_path / 'ws'
    run(digits, ws, '--num-epochs', '3', '--save-frequency', '1', '--keep-checkpoints', '2', '--mode', 'train',
        '--num-examples', '64', '--data-backend', 'synthetic')
    assert sorted(n for n in os.listdir(ws) if n.endswith('.params')) == ['model_0001.params', 'model_0002.params']


@pytest.mark.integration
def test_target_accuracy_stops_and_reports(digits, tmp_path):
    ws = tmp_path / 'ws'
    result = run(digits, ws, '--num-epochs', '5', '--target-accuracy', '0.01', '--data-backend', 'synthetic',
                 '--num-examples', '64')
    assert result.returncode == 0
    assert [r['step'] for r in epoch_records(ws)] == [[0]]
    summary = json.loads((ws / 'report.json').read_text())['summary']
    assert summary['target_accuracy'] == 0.01 and summary['target_accuracy.epoch'] == 0
    assert summary['target_accuracy.wall_seconds'] > 0
    meta = checkpoint.read_state(str(ws / 'model_last.state')).meta
    assert meta['epoch'] == 1 and meta['wall_seconds'] == summary['target_accuracy.wall_seconds']
    again = refused(digits, ws, '--num-epochs', '5', '--target-accuracy', '0.01', '--data-backend', 'synthetic',
                    '--num-examples', '64')                    # nothing left to train: in process
    assert again.returncode == 0 and len(epoch_records(ws)) == 1                 # no more epochs


@pytest.mark.integration
def test_sparse_evaluation_validates_only_its_epochs_and_the_last(digits, tmp_path):
    """--eval-period 3 --eval-offset 1 over 4 epochs: validated after epochs 1 and 3 (the last); the best
    checkpoint (and --target-accuracy, which reads the same history) see those only; the summary lists them."""
    ws = tmp_path / 'ws'
    run(digits, ws, '--num-epochs', '4', '--eval-period', '3', '--eval-offset', '1', '--data-backend', 'synthetic',
        '--num-examples', '64')
    validated = [r['step'][0] for r in epoch_records(ws) if 'val.accuracy' in r['data']]
    assert validated == [1, 3] and len(epoch_records(ws)) == 4
    summary = json.loads((ws / 'report.json').read_text())['summary']
    assert summary['val.epochs'] == '1,3' and summary['val.accuracy.epoch'] in (1, 3)
    assert (ws / 'model_best.params').exists()


@pytest.mark.unit
def test_target_accuracy_needs_validation(digits, tmp_path):
    result = refused(digits, tmp_path / 'ws', '--mode', 'train', '--target-accuracy', '0.5')
    assert result.returncode == 2 and 'error: --target-accuracy needs a validation' in result.stderr


@pytest.mark.integration
def test_weight_average_is_validated_saved_and_loadable(digits, tmp_path):
    ws = tmp_path / 'ws'
    run(digits, ws, '--num-epochs', '2', '--data-backend', 'mxnet', '--model-ema', '--model-ema-decay', '0.8',
        '--num-examples', '64')
    epochs = epoch_records(ws)
    assert {'val.ema.loss', 'val.ema.accuracy', 'val.ema.top_k_accuracy_5'} <= set(epochs[1]['data'])
    assert epochs[1]['data']['val.ema.loss'] != epochs[1]['data']['val.loss']
    report = json.loads((ws / 'report.json').read_text())
    assert [e['val.ema.accuracy'] for e in report['epochs']] == [e['data']['val.ema.accuracy'] for e in epochs]
    assert report['summary']['val.ema.accuracy'] == max(e['data']['val.ema.accuracy'] for e in epochs)
    state = checkpoint.read_state(str(ws / 'model_last.state'))
    assert set(state.extra) == {'ema:' + name for name in state.params} | {ema.UPDATES_NAME}
    assert state.meta['ema_best_accuracy'] == report['summary']['val.ema.accuracy']
    best_epoch = max(epochs, key=lambda e: e['data']['val.ema.accuracy'])['data']
    cmd = train_cmd(digits, tmp_path / 'eval', '--mode', 'val', '--data-backend', 'mxnet', '--load',
                    ws / 'model_ema_best.params')
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert epoch_records(tmp_path / 'eval')[0]['data']['val.accuracy'] == pytest.approx(best_epoch['val.ema.accuracy'])


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, round(e.value, 5)) for e in events.Scalars(tag)] for tag in events.Tags()['scalars']}


class RecordsOnly:
    def __init__(self):
        self.records = []

    def log(self, step, data, note=''):
        self.records.append((step, data))


# A stand-in for PyTorch that fails where the real one crashes: imported after horovod.mxnet.
TORCH_AFTER_HOROVOD_FAILS = """import sys
if 'horovod.mxnet' in sys.modules:
    raise RuntimeError('torch imported after horovod.mxnet: the real one segfaults there')
Tensor = type('Tensor', (), {})
"""


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.integration
def test_tensorboard_on_a_horovod_worker_loads_its_writer_before_horovod(tmp_path):
    """tensorboardX imports PyTorch wherever it is installed, and PyTorch imported after horovod.mxnet crashed the
    process (torch 2.14.1, Horovod 0.28.1): every runner launch with --tensorboard is a Horovod worker. With the
    stand-in `torch` above on the path, a one-worker Horovod run writes its event file."""
    (tmp_path / 'path' / 'torch').mkdir(parents=True)
    (tmp_path / 'path' / 'torch' / '__init__.py').write_text(TORCH_AFTER_HOROVOD_FAILS)
    result = run_script('train.py', '--data-backend', 'synthetic', '--num-layers', '10', '--image-shape', '3,32,32',
                        '--num-classes', '10', '--num-examples', '32', '--batch-size', '16', '--num-epochs', '1',
                        '--mode', 'train', '--kv-store', 'horovod', '--tensorboard', '--workspace', tmp_path / 'ws',
                        check=False, env=dict(os.environ, PYTHONPATH=str(tmp_path / 'path')))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(os.listdir(tmp_path / 'ws' / 'tensorboard')) == 1


@pytest.mark.unit
def test_tensorboard_scalars_are_on_disk_when_the_record_is_logged(tmp_path):
    """No writer thread between a record and the file: tensorboardX's SummaryWriter queued events for one, and
    its flush() wrote only what the thread had taken, so a run killed right after an epoch's validation once
    lost that epoch's val/ scalars (the kill test below, in the suite)."""
    args = SimpleNamespace(tensorboard=str(tmp_path / 'tb'), workspace=str(tmp_path), model_prefix='model')
    threads = set(threading.enumerate())
    dllogger = RecordsOnly()
    logger = tensorboard_log.teed(Workspace.of(args).place(args.tensorboard), workers.World(), dllogger, 4,
                                  {'epoch': 0, 'iteration': 0})
    logger.log((0, 2), {'train.loss': 1.5, 'train.lr': 0.1})
    logger.log((0,), {'val.accuracy': 0.5, 'val.ips': 900.0})
    assert set(threading.enumerate()) <= threads      # no thread started (others' may have ended)
    assert scalars(tmp_path / 'tb') == {'train/loss': [(2, 1.5)], 'train/lr': [(2, 0.1)], 'val/accuracy': [(4, 0.5)]}
    assert len(dllogger.records) == 2


@pytest.mark.integration
def test_resume_after_kill_is_exact_with_every_feature(digits, tmp_path):
    """--model-ema, CutMix with mixup, --grad-accum-steps and --tensorboard: a run killed (-9) in its second
    epoch and resumed gives the metrics of an uninterrupted run, and TensorBoard's reader sees every step
    once, with the uninterrupted run's values (speeds aside)."""
    flags = ['--num-epochs', '2', '--data-backend', 'synthetic', '--num-examples', '128', '--model-ema',
             '--model-ema-decay', '0.8', '--cutmix', '1.0', '--mixup', '0.2', '--grad-accum-steps', '2', '--tensorboard']
    run(digits, tmp_path / 'whole', *flags)
    ws = tmp_path / 'killed'
    kill_once_logged(digits, ws, flags)
    run(digits, ws, *flags)
    assert metrics_without_speed(epoch_records(ws)) == metrics_without_speed(epoch_records(tmp_path / 'whole'))
    assert 'val.ema.accuracy' in epoch_records(ws)[1]['data']
    whole, resumed = scalars(tmp_path / 'whole' / 'tensorboard'), scalars(ws / 'tensorboard')
    assert len(os.listdir(ws / 'tensorboard')) == 2                      # the killed run's file and the resumed one's
    assert set(whole) == {'train/loss', 'train/lr', 'train/ips', 'val/loss', 'val/accuracy',
                          'val/top_k_accuracy_5', 'val/ema/loss', 'val/ema/accuracy', 'val/ema/top_k_accuracy_5'}
    assert [s for s, _ in resumed['train/loss']] == [2, 4, 6, 8]
    for tag in whole:
        if tag != 'train/ips':
            assert resumed[tag] == whole[tag], tag
