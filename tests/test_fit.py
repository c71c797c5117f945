"""fit.py and losses.py: targets, loss scaling, and the training step in float16, on several devices and on
several workers; end to end through train.py on the digits set: --keep-checkpoints, --target-accuracy, sparse
evaluation, and the exact resume after a kill with every feature of timm and torchvision together."""
import dataclasses
import json
import os
import shutil

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import dali
import fit
from rn50.optim import schedule
from rn50.training import losses
from rn50.checkpoints import checkpoint
from rn50.checkpoints import optimizer_state
from rn50.checkpoints.saver import Progress
from rn50.world import devices, workers
from conftest import digits_flags, gloo_workers, resolved, scalars
from float16_twin import Float16Net, batch_of, step_for
from test_train import epoch_records, kill_once_logged, metrics_without_speed, refused, run
from rn50.errors import RecipeError
from rn50.training.step import StepSettings, TrainingStep
from rn50.data import contract


# ---- targets ----------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_label_smoothing_targets():
    targets = losses.smoothed_one_hot(mx.nd.array([2, 0]), 1000, 0.1).asnumpy()
    assert targets[0, 2] == pytest.approx(0.9001)
    assert targets[0, 0] == pytest.approx(0.0001)
    assert targets.sum(axis=1) == pytest.approx([1, 1])


@pytest.mark.unit
def test_mixup_pairs_reversed_batch():
    images = mx.nd.array(np.arange(3 * 2).reshape(3, 2, 1, 1))
    targets = losses.smoothed_one_hot(mx.nd.array([0, 1, 2]), 3, 0.0)
    lam = mx.nd.array([1.0, 0.5, 0.25])
    mixed_images, mixed_targets = losses.mixup(images, targets, lam)
    np.testing.assert_allclose(mixed_images.asnumpy()[:, :, 0, 0], [[0, 1], [2, 3], [0.25 * 4 + 0.75 * 0,
                                                                                     0.25 * 5 + 0.75 * 1]])
    np.testing.assert_allclose(mixed_targets.asnumpy(), [[1, 0, 0], [0, 1, 0], [0.75, 0, 0.25]])


@pytest.mark.unit
def test_mixup_weights_are_a_function_of_position():
    a = losses.mixup_weights(7, 3, 11, 0, 0, 8, 0.2)
    assert np.array_equal(a, losses.mixup_weights(7, 3, 11, 0, 0, 8, 0.2))
    assert not np.array_equal(a, losses.mixup_weights(7, 3, 12, 0, 0, 8, 0.2))
    assert ((a >= 0) & (a <= 1)).all()


# ---- loss scaling -----------------------------------------------------------------------------------------

@pytest.mark.unit
def test_dynamic_loss_scale_halves_on_overflow_and_grows():
    param = gluon.Parameter('w', shape=(3,))
    param.initialize()
    scale = losses.DynamicLossScale(scale=8.0, interval=2)
    param.list_grad()[0][:] = mx.nd.array([1, np.inf, 0])
    assert scale.overflowed(scale.check([param])) and scale.scale == 4.0 and scale.skipped == 1
    param.list_grad()[0][:] = mx.nd.array([1, 2, 3])
    assert not scale.overflowed(scale.check([param])) and not scale.overflowed(scale.check([param]))
    assert scale.scale == 8.0


# ---- the training step with float16 and several devices, on the CPU (twins of the GPU paths) ---------------

@pytest.mark.unit
def test_float16_step_with_loss_scaling_skips_overflows_and_grows():
    """The GPU default (--dtype float16 without AMP): float16 and float32 gradients side by side (they
    crashed multi_all_finite before), float32 master weights, growth after clean steps, a skipped step on an
    inf gradient, and the divergence stop at the floor."""
    mx.random.seed(0)
    step = step_for(Float16Net(), 'float16')
    step.loss_scale = losses.DynamicLossScale(scale=8.0, interval=2)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)
    weight = step.net.weight
    assert np.dtype(weight.dtype) == np.float16 and np.dtype(step.net.bn.gamma.dtype) == np.float32
    before = weight.data().asnumpy().copy()
    values = [float(step.run(batch_of(images, labels, 'float16'), 0, i, 0.1).asscalar()) for i in range(2)]
    assert all(np.isfinite(values)) and step.loss_scale.scale == 16.0          # doubled after 2 clean steps
    assert not np.array_equal(weight.data().asnumpy(), before)
    assert step.gluon_trainer._updaters[0].states[0][0].dtype == np.float32    # float32 master weights
    bad = images.copy()
    bad[0, 0, 0, 0] = np.inf
    trained = weight.data().asnumpy().copy()
    step.run(batch_of(bad, labels, 'float16'), 0, 2, 0.1)
    assert step.loss_scale.scale == 8.0 and step.loss_scale.skipped == 1
    np.testing.assert_array_equal(weight.data().asnumpy(), trained)             # the step was skipped
    restored = losses.DynamicLossScale()
    restored.restore(step.scaler_state())
    assert restored.state() == {'scale': 8.0, 'clean_steps': 0, 'skipped': 1}
    step.loss_scale.scale = 1.0
    with pytest.raises(RecipeError, match='loss scale fell below 1 at epoch 0 iteration 3'):
        step.run(batch_of(bad, labels, 'float16'), 0, 3, 0.1)


@pytest.mark.unit
def test_a_step_that_doubles_the_loss_scale_divides_by_the_scale_it_was_computed_with():
    """Reading the overflow flag doubles the scale after `interval` clean steps; the update of that step was
    given the doubled scale (its gradients divided by twice the scale of its loss: half a step every 2000).
    Scaling by powers of 2 is exact, so a run whose scale grows trains bit for bit as one whose scale stays."""
    rng = np.random.default_rng(1)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), 'float16') for _ in range(3)]
    weights = []
    for interval in (2, 1000):
        mx.random.seed(0)
        step = step_for(Float16Net(), 'float16')
        step.loss_scale = losses.DynamicLossScale(scale=8.0, interval=interval)
        for i, batch in enumerate(batches):
            step.run(batch, 0, i, 0.1)
        weights.append(step.net.weight.data().asnumpy())
    assert step.loss_scale.scale == 8.0
    np.testing.assert_array_equal(weights[0], weights[1])


def epochs_of(args, step, loader):
    """fit.Epochs of `step` on `loader`'s batches at the flags' schedule, a DLLogger that says nothing, no stop
    requested and no files being written."""
    stop = type('Stop', (), {'requested': False, 'announce': lambda self: None})()
    quiet = type('DLLogger', (), {'log': lambda self, *args, **kwargs: None})()
    return fit.Epochs(step, loader, schedule.Schedule.of(args), loader.num_batches, args.disp_batches, quiet, stop,
                      None, 'model_last.state')


class RecordingLoader:
    """Fixed batches; records in `events` when each one is requested."""

    def __init__(self, batches, events):
        self.batches, self.events = batches, events
        self.num_batches, self.batch_size = len(batches), batches[0].data[0].shape[0]

    def epoch(self, epoch, start=0):
        for index in range(start, self.num_batches):
            self.events.append(('fetch', index))
            yield self.batches[index]


@pytest.mark.unit
def test_float16_step_fetches_the_next_batch_before_its_host_synchronisation():
    """The host waits for the overflow flag once per float16 step; batch i+1 (DALI's external source and
    copy on a GPU node) must be fetched before that wait of step i, not after it while the device idles.
    The training is that of plain consecutive steps: same weights, same skipped step (an inf in batch 1)."""
    rng = np.random.default_rng(2)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), 'float16') for _ in range(3)]
    batches[1].data[0][0, 0, 0, 0] = np.inf
    mx.random.seed(0)
    step = step_for(Float16Net(), 'float16')
    events, read_flag = [], step.loss_scale.overflowed

    def overflowed(finite):
        events.append(('sync', sum(kind == 'sync' for kind, _ in events)))
        return read_flag(finite)
    step.loss_scale.overflowed = overflowed
    args = resolved(['--lr', '0.1', '--num-epochs', '2', '--warmup-epochs', '0'])
    next_batch, _, stopped = fit.train_epoch(epochs_of(args, step, RecordingLoader(batches, events)), 0, 0,
                                             Progress())
    assert (next_batch, stopped) == (3, False)
    assert events == [('fetch', 0), ('fetch', 1), ('sync', 0), ('fetch', 2), ('sync', 1), ('sync', 2)]
    mx.random.seed(0)
    plain = step_for(Float16Net(), 'float16')
    for i, batch in enumerate(batches):
        plain.run(batch, 0, i, schedule.learning_rate(i / 3, 0.1, 2))
    assert step.loss_scale.state() == plain.loss_scale.state() and step.loss_scale.skipped == 1
    np.testing.assert_array_equal(step.net.weight.data().asnumpy(), plain.net.weight.data().asnumpy())


class HostReads:
    """Records, in order, the step's backward, its update and every read of a device array by the host."""

    READS = ('asscalar', 'asnumpy', 'wait_to_read')

    def __init__(self, monkeypatch, step):
        self.events = []
        for name in self.READS:
            original = getattr(mx.nd.NDArray, name)
            monkeypatch.setattr(mx.nd.NDArray, name, self.recorded('read', original))
        monkeypatch.setattr(mx.autograd, 'backward', self.recorded('backward', mx.autograd.backward))
        monkeypatch.setattr(step.gluon_trainer, 'update', self.recorded('update', step.gluon_trainer.update))

    def recorded(self, what, function):
        def call(*args, **kwargs):
            self.events.append(what)
            return function(*args, **kwargs)
        return call

    def between_backward_and_update(self):
        """The host reads between each backward and the update that follows it."""
        counts, inside = [], False
        for event in self.events:
            if event == 'backward':
                counts.append(0)
                inside = True
            elif event == 'update':
                inside = False
            elif inside:
                counts[-1] += 1
        return counts


@pytest.mark.parametrize('contexts', [[mx.cpu()], [mx.cpu(0), mx.cpu(1)]])
@pytest.mark.unit
def test_the_float16_step_on_a_gpu_queues_its_update_before_any_host_read(monkeypatch, contexts):
    """The GPU default (float16, dynamic loss scaling) read the overflow flag between backward and update: the
    device idled while the host then queued the update and the next forward (the original recipe read nothing
    before its update). Now, on GPUs, what the update writes is copied on the device, the update is queued, the
    flag is read, and an overflowed update is undone. The CPU twin (MXNet made to see a GPU step on CPU
    contexts, one or two devices): no host read between backward and update after the first step (which creates
    the optimizer state), and the same weights, master weights, momenta, loss scale and skipped steps as the
    CPU's skip-before-update, with an inf at steps 2 and 4."""
    rng = np.random.default_rng(6)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), 'float16') for _ in range(6)]
    for index in (2, 4):
        batches[index].data[0][1, 0, 0, 0] = np.inf
    results = []
    for kind in ('gpu', 'cpu'):
        mx.random.seed(0)
        step = step_for(Float16Net(), 'float16', contexts=contexts, kind=kind)
        step.loss_scale = losses.DynamicLossScale(scale=8.0, interval=2)
        reads = HostReads(monkeypatch, step)
        for i, batch in enumerate(batches):
            step.run(batch, 0, i, 0.1)
        monkeypatch.undo()
        counts = reads.between_backward_and_update()
        assert len(counts) == 6 and counts[0] > 0, counts               # the first step creates the state
        assert all(count == 0 if kind == 'gpu' else count > 0 for count in counts[1:]), (kind, counts)
        states = step.gluon_trainer._updaters[0].states
        results.append([step.net.weight.data(c).asnumpy() for c in contexts] + [
            array.asnumpy() for index in sorted(states) for array in optimizer_state.flat_arrays(states[index])] + [
            step.loss_scale.state(), step.gluon_trainer._optimizer.num_update])
    gpu, cpu = results
    assert gpu[-2] == cpu[-2] and gpu[-2]['skipped'] == 2 and gpu[-1] == cpu[-1] == 4
    for a, b in zip(gpu[:-2], cpu[:-2]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.unit
def test_overflow_check_orders_the_float16_step_and_is_refused_where_nothing_reads_it():
    """Issue 57 item 4: the float16 step's order had no switch. --overflow-check before-update makes a GPU's
    step read the flag before its update (no device copies), after-update makes a CPU's queue its update first
    (UpdateUndo); without it each device keeps its default. A float32 or --amp run has no such flag to order:
    the flag is refused there."""
    for kind, flag, undone in (('gpu', [], True), ('gpu', ['--overflow-check', 'before-update'], False),
                               ('cpu', [], False), ('cpu', ['--overflow-check', 'after-update'], True)):
        mx.random.seed(0)
        step = step_for(Float16Net(), 'float16', kind=kind, extra=flag)
        assert (step.undo is not None) == undone, (kind, flag)
    fit.check_training_flags(resolved(['--overflow-check', 'before-update'], dtype='float16'))
    for values in ({}, {'dtype': 'float16', 'amp': True}):
        with pytest.raises(RecipeError, match='--overflow-check orders the loss scaling of --dtype float16'):
            fit.check_training_flags(resolved(['--overflow-check', 'after-update'], **values))


class RecordedLoss:
    """A step's loss whose host read is recorded in `events`."""

    def __init__(self, loss, iteration, events):
        self.loss, self.iteration, self.events = loss, iteration, events

    def asscalar(self):
        self.events.append(('read', self.iteration))
        return self.loss.asscalar()


@pytest.mark.unit
@pytest.mark.parametrize('kind, order', [
    ('cpu', ['run 0', 'read 0', 'run 1', 'read 1', 'run 2', 'read 2']),
    ('gpu', ['run 0', 'run 1', 'read 0', 'run 2', 'read 1', 'read 2'])])
def test_the_host_reads_each_loss_at_once_on_the_cpu_and_one_step_late_on_a_gpu(kind, order):
    """On a GPU the host queues step i+1 before it waits for loss i (the device stays busy). On the CPU the
    host's cores are the device's: queueing the next step beside oneDNN's threads made ResNet-50's step 3-6%
    slower than a loop that reads each loss at once, so there it does."""
    rng = np.random.default_rng(3)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)) for _ in range(3)]
    step = step_for(Float16Net(), 'float32')
    step.world = dataclasses.replace(step.world, devices=devices.Devices(step.world.devices.contexts, kind))
    events, run = [], step.run

    def recorded_run(batch, epoch, iteration, lr, before_sync=None):
        events.append(('run', iteration))
        return RecordedLoss(run(batch, epoch, iteration, lr, before_sync), iteration, events)
    step.run = recorded_run
    args = resolved(['--lr', '0.1', '--num-epochs', '2', '--warmup-epochs', '0'])
    progress = Progress()
    fit.train_epoch(epochs_of(args, step, RecordingLoader(batches, [])), 0, 0, progress)
    assert [f'{what} {index}' for what, index in events] == order
    assert progress.loss_count == 3


@pytest.mark.unit
def test_two_devices_in_one_process_follow_one_device():
    """--kv-store device over two CPU contexts: each takes half the batch, gradients are summed over the
    devices; without batchnorm (whose statistics are per device) the losses equal one device's."""
    rng = np.random.default_rng(1)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)) for _ in range(4)]
    trajectories = []
    for contexts in ([mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]):
        mx.random.seed(5)
        step = step_for(Float16Net(batchnorm=False), contexts=contexts)
        trajectories.append([float(step.run(b, 0, i, 0.5).asscalar()) for i, b in enumerate(batches)])
    np.testing.assert_allclose(trajectories[1], trajectories[0], rtol=1e-5)
    assert trajectories[0][-1] < trajectories[0][0]


@pytest.mark.unit
def test_dali_slices_reach_the_step_on_their_devices_without_a_join(digits):
    """--kv-store device with DALI on several devices (the dali-cpu pipelines run per CPU context here, as
    dali-gpu's run per GPU): each slice stays on its device and is the very array the network gets on that
    device (no join on the first device, no split); training equals that of the joined batches."""
    contexts = [mx.cpu(0), mx.cpu(1)]
    args = resolved(digits_flags(digits, batch=8) + ['--data-backend', 'dali-cpu', '--label-smoothing', '0',
                                                      '--kv-store', 'device', '--wd', '0', '--seed', '1'])
    loader = dali.DaliLoader.of(args, 0, 1, True, contexts=contexts, seed=1)
    slices = [batch for _, batch in zip(range(3), loader.epoch(0))]
    for batch in slices:
        assert [p.context for p in batch.data[0]] == contexts == [p.context for p in batch.label[0]]
    joined = [mx.io.DataBatch(data=[contract.joined(b.data[0])], label=[contract.joined(b.label[0])]) for b in slices]
    weights, inputs = [], []
    for batches in (slices, joined):
        mx.random.seed(5)
        net = Float16Net(classes=10, channels=3, batchnorm=False)
        net.initialize(ctx=contexts)
        step = TrainingStep(net, workers.World(devices=devices.Devices(tuple(contexts))), StepSettings.of(args), seed=1)
        seen = []
        step.net = lambda x, net=net, seen=seen: seen.append(x) or net(x)
        initial = net.weight.data(contexts[0]).asnumpy().copy()
        for i, batch in enumerate(batches):
            step.run(batch, 0, i, 0.1)
        weights.append(net.weight.data(contexts[0]).asnumpy())
        inputs.append(seen)
    assert all(x is part for x, part in zip(inputs[0], [p for b in slices for p in b.data[0]]))
    assert len(inputs[0]) == 6 and [x.context for x in inputs[1]] == contexts * 3
    np.testing.assert_array_equal(weights[0], weights[1])
    assert not np.array_equal(weights[0], initial)


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.multiworker
def test_an_overflow_on_one_worker_skips_the_step_on_every_worker(tmp_path):
    """2 Gloo workers in float16: rank 1 alone meets an inf; after the all-reduce both skip that step, halve
    the same scale and keep identical weights; the gradients are pre-divided by sqrt(2), and all-reduced in the
    groups the runner's MXNET_HOROVOD_NUM_GROUPS asks for (Horovod's grouped path, as on a GPU node)."""
    ranks = gloo_workers('float16_twin.py', tmp_path / 'workers.json', MXNET_HOROVOD_NUM_GROUPS='2')
    assert [(r['scale'], r['skipped'], r['clean_steps']) for r in ranks] == [(4.0, 1.0, 1.0)] * 2   # 8 halved
    assert ranks[0]['weight'] == ranks[1]['weight']
    # float16 gradients divided by sqrt(2) before the sum and after it (step.predivision), not summed first
    assert [r['predivide'] for r in ranks] == pytest.approx([2 ** 0.5] * 2, rel=1e-6)
    assert [r['groups'] for r in ranks] == [2, 2]


@pytest.mark.unit
def test_a_stop_signal_landing_inside_a_log_write_writes_nothing_itself(monkeypatch):
    """The handler runs between two bytecodes of the main thread, possibly inside a write to the log's stream
    (in CPython, a blocked write that a signal interrupts runs the handler inside the buffered writer); the
    old handler logged there, writing to the stream again from inside its own write. Now it only sets flags,
    and the message comes once from announce() at the next iteration boundary."""
    import logging
    import os
    import signal
    import sys

    from rn50.launch.stop import StopRequest
    from rn50.reports import logs

    class Stream:
        """Records a write that starts while another is under way (io.BufferedWriter raises there)."""
        def __init__(self):
            self.depth, self.text, self.reentered, self.fired = 0, '', False, False

        def write(self, text):
            self.reentered = self.reentered or self.depth > 0
            self.depth += 1
            try:
                if not self.fired:
                    self.fired = True
                    os.kill(os.getpid(), signal.SIGTERM)    # the signal lands in the middle of this write
                    for _ in range(1000):                   # bytecode boundaries: the handler runs here
                        pass
                self.text += text
            finally:
                self.depth -= 1

        def flush(self):
            pass

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    stream = Stream()
    handler = logs.BarSafeHandler()      # writes to sys.stderr as it is at each line
    monkeypatch.setattr(sys, 'stderr', stream)
    root = logging.getLogger()
    # this handler alone: one that an earlier train.main in this process set up writes to sys.stderr as well
    monkeypatch.setattr(root, 'handlers', [])
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        stop = StopRequest()
        logging.getLogger('fit').info('a line of the training loop')
        assert stop.requested and not stream.reentered
        stop.announce()
        stop.announce()
        assert stream.text.count('SIGTERM received: stopping at the next iteration boundary') == 1
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        for sig, old in previous.items():
            signal.signal(sig, old)


@pytest.mark.parametrize('threshold', [None, 0.2])
@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.unit
def test_bce_loss_is_the_mean_binary_cross_entropy_of_each_class(dtype, threshold):
    """--bce-loss: the step's loss is timm's BinaryCrossEntropy, written out here: the mean over the classes of
    -t log sigmoid(z) - (1 - t) log(1 - sigmoid(z)), with t the label-smoothed targets, made 0/1 by
    --bce-target-thresh; float32 and the float16 twin (loss scaling)."""
    extra = ['--bce-loss', '--label-smoothing', '0.1'] + \
        (['--bce-target-thresh', str(threshold)] if threshold is not None else [])
    step = step_for(Float16Net(), dtype, extra=extra)
    if step.loss_scale is not None:
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    rng = np.random.default_rng(2)
    images, labels = rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)
    batch = batch_of(images, labels, dtype)
    with autograd.record():     # the logits of the batch as the step computes them (training-mode batchnorm)
        logits = step.net(batch.data[0]).asnumpy().astype(np.float64)
    loss = float(step.run(batch, 0, 0, 0.1).asscalar())
    targets = np.full((8, 3), 0.1 / 3)
    targets[np.arange(8), labels] = 0.9 + 0.1 / 3
    if threshold is not None:
        targets = (targets > threshold).astype(float)
    probabilities = 1 / (1 + np.exp(-logits))
    expected = -(targets * np.log(probabilities) + (1 - targets) * np.log(1 - probabilities)).mean()
    assert loss == pytest.approx(expected, rel=2e-3 if dtype == 'float16' else 1e-5)
    assert step.loss_scale is None or step.loss_scale.skipped == 0


@pytest.mark.unit
def test_bce_target_threshold_without_bce_loss_is_refused():
    with pytest.raises(RecipeError, match='add --bce-loss'):
        fit.check_training_flags(resolved(['--bce-target-thresh', '0.2']))


# ---- end to end on the digits set --------------------------------------------------------------------------

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
