"""checkpoint.py and files.py's file safety: the .state round trip, checksums and the previous state, clear
errors for damaged and mismatched files, fine-tuning loads, atomic writes and their failures, and the resume's
check of a run's settings (resume.py)."""
import argparse
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from rn50.checkpoints import checkpoint
from rn50.checkpoints import optimizer_state
from rn50.checkpoints import resume
from rn50.checkpoints import weight_loading
from rn50.checkpoints.workspace import Workspace
from rn50 import files
import fit
import models
from conftest import ROOT, allocated
from rn50.errors import RecipeError

pytestmark = pytest.mark.unit


def tiny_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, in_units=3), gluon.nn.BatchNorm(in_channels=4), gluon.nn.Dense(2, in_units=4))
    net.initialize()
    return net


def test_state_round_trip(tmp_path):
    net = tiny_net()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)
    path = str(tmp_path / 'm_last.state')
    checkpoint.save_state(path, net, trainer, {'epoch': 3, 'iteration': 7}, extra={'ema:w': mx.nd.ones((2,)) / 4})
    state = checkpoint.read_state(path)
    params, trainer_states, meta = state.params, state.trainer, state.meta
    assert meta == {'epoch': 3, 'iteration': 7}
    assert list(state.extra) == ['ema:w'] and state.extra['ema:w'].asnumpy().tolist() == [0.25, 0.25]
    other = tiny_net()
    checkpoint.load_params_into(other, params, [mx.cpu()])
    x = mx.nd.random.uniform(shape=(2, 3))
    np.testing.assert_array_equal(net(x).asnumpy(), other(x).asnumpy())
    assert len(trainer_states) > 0
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)   # ordinary permissions, not mkstemp's


def trained_on(ctx):
    """tiny_net on `ctx` after one SGD step with momentum and float32 master weights (multi_precision)."""
    net = tiny_net()
    net.collect_params().reset_ctx(ctx)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9,
                                                           'multi_precision': True})
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 3), ctx=ctx)).sum()
    loss.backward()
    trainer.step(2)
    return net, trainer


def devices_in(value):
    if isinstance(value, mx.nd.NDArray):
        return {value.context}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return set().union(*(devices_in(item) for item in value))
    return set()


def test_a_state_holds_cpu_arrays_and_resumes_onto_the_workers_own_device(tmp_path):
    """Twin of a worker on gpu(3) whose state is resumed on gpu(1): Gluon pickles each optimizer array with its
    device, so every worker of an 8-GPU resume used to unpickle rank 0's state onto GPU 0. cpu(3) saves,
    the file holds cpu(0) arrays only, and a resume on cpu(1) has its optimizer state on cpu(1). (MXNet
    recreates any CPU array as cpu(0), so on a CPU only the resume side can fail; scripts/gpu_check.py's
    `resume` check reads a GPU-saved state.)"""
    import pickle
    net, trainer = trained_on(mx.cpu(3))
    path = str(tmp_path / 'm_last.state')
    checkpoint.save_state(path, net, trainer, {'epoch': 1},
                          extra={'ema:' + name: p.data(mx.cpu(3)) for name, p in net._collect_params_with_prefix().items()})
    assert {array.context for array in mx.nd.load(path).values()} == {mx.cpu(0)}
    state = checkpoint.read_state(path)
    saved_states, _ = pickle.loads(state.trainer)
    assert devices_in(saved_states) == {mx.cpu(0)} and len(saved_states) == 6

    resumed, resumed_trainer = trained_on(mx.cpu(1))
    optimizer_state.restore_trainer_state(resumed_trainer, state.trainer)
    updater = resumed_trainer._updaters[0]
    assert devices_in(updater.states) == {mx.cpu(1)}
    for index in saved_states:   # the values survive the move: (float32 master weight, momentum) per array
        for saved, restored in zip(saved_states[index], updater.states[index]):
            np.testing.assert_array_equal(saved.asnumpy(), restored.asnumpy())


def lamb_steps(net, trainer, ctx, steps):
    for k in range(steps):
        with mx.autograd.record():
            loss = (net(mx.nd.full((2, 3), k + 1.0, ctx=ctx)) ** 2).sum()
        loss.backward()
        trainer.step(2)


def test_a_resume_on_another_device_continues_the_optimizers_step_counts():
    """Twin of a Horovod worker on gpu(1) resuming rank 0's state saved from gpu(0): MXNet keeps LAMB's step
    count per device id, and the state held only device 0's, so the worker restarted its bias correction at
    step 1 while rank 0 continued (the replicas drifted apart). The resumed step must be the uninterrupted
    one, on cpu(1) as on cpu(0)."""
    def lamb_on(ctx):
        net = tiny_net()
        net.collect_params().reset_ctx(ctx)
        net.collect_params().setattr('wd_mult', 1.0)
        return net, gluon.Trainer(net.collect_params(), 'lamb', {'learning_rate': 0.1, 'wd': 0.01})

    net, trainer = lamb_on(mx.cpu(0))
    lamb_steps(net, trainer, mx.cpu(0), 3)
    state = optimizer_state.trainer_state_bytes(trainer)
    weights = {name: p.data().copy() for name, p in net._collect_params_with_prefix().items()}
    lamb_steps(net, trainer, mx.cpu(0), 1)          # the uninterrupted run's 4th step

    for device in (0, 1):
        resumed, resumed_trainer = lamb_on(mx.cpu(device))
        for name, p in resumed._collect_params_with_prefix().items():
            p.set_data(weights[name].as_in_context(mx.cpu(device)))
        optimizer_state.restore_trainer_state(resumed_trainer, state)
        lamb_steps(resumed, resumed_trainer, mx.cpu(device), 1)
        assert resumed_trainer._optimizer._index_update_count == trainer._optimizer._index_update_count
        for name, p in net._collect_params_with_prefix().items():
            np.testing.assert_allclose(resumed._collect_params_with_prefix()[name].data().asnumpy(),
                                       p.data().asnumpy(), rtol=1e-6, atol=1e-7, err_msg=f'cpu({device}) {name}')


def test_saving_the_optimizer_state_recreates_no_array_on_the_device(monkeypatch):
    """The CPU copy of the optimizer state is made from the Updater's arrays: unpickling Gluon's own file put a
    second copy of every array on rank 0's GPU at each save (NDArray.__setstate__ recreates an array on the
    device it was pickled from)."""
    net, trainer = trained_on(mx.cpu(3))
    recreated = []
    original = mx.nd.NDArray.__setstate__
    monkeypatch.setattr(mx.nd.NDArray, '__setstate__', lambda self, state: (recreated.append(1),
                                                                           original(self, state))[1])
    optimizer_state.trainer_state_bytes(trainer)
    assert not recreated


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / 'report.json'
    files.write_json(str(path), {'a': 1})
    with pytest.raises(TypeError):
        files.write_json(str(path), {'a': object()})          # not serialisable: fails mid-write
    assert json.loads(path.read_text()) == {'a': 1}
    assert [p.name for p in tmp_path.iterdir()] == ['report.json']   # no temporary left behind


def test_nan_metrics_are_stored_as_null(tmp_path):
    path = tmp_path / 'report.json'
    files.write_json(str(path), {'epochs': [{'train.loss': float('nan'), 'val.accuracy': 0.5}],
                                'summary': {'train.loss': float('inf')}})
    assert json.loads(path.read_text()) == {'epochs': [{'train.loss': None, 'val.accuracy': 0.5}],
                                            'summary': {'train.loss': None}}


def saved_state(tmp_path, epoch):
    net = tiny_net()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    path, previous = str(tmp_path / 'model_last.state'), str(tmp_path / 'model_prev.state')
    checkpoint.save_state(path, net, trainer, {'epoch': epoch, 'iteration': 0}, previous=previous)
    return path, previous


def test_each_state_keeps_the_one_it_replaces(tmp_path):
    saved_state(tmp_path, 1)
    path, previous = saved_state(tmp_path, 2)
    assert checkpoint.read_state(path).meta['epoch'] == 2 and checkpoint.read_state(previous).meta['epoch'] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ['model_last.state', 'model_prev.state']


@pytest.mark.parametrize('damage', ['overwrite', 'truncate'])
def test_damaged_state_is_a_clear_error_naming_the_previous_one(tmp_path, damage):
    saved_state(tmp_path, 1)
    path, previous = saved_state(tmp_path, 2)
    content = bytearray(open(path, 'rb').read())
    middle = len(content) // 2
    if damage == 'overwrite':
        content[middle:middle + 100] = bytes(100)        # silently loaded before checksums
    else:
        content = content[:middle]
    open(path, 'wb').write(bytes(content))
    with pytest.raises(RecipeError, match=f'{path} is damaged .*previous good state is {previous}: resume from it '
                                          f'with --load {previous}'):
        checkpoint.read_state(path, fallback=previous)


def test_not_a_state_file_is_a_clear_error(tmp_path):
    path = tmp_path / 'model_last.state'
    path.write_bytes(b'not a checkpoint')
    with pytest.raises(RecipeError, match='is damaged .truncated or corrupt: Invalid NDArray file format'):
        checkpoint.read_state(str(path))


def test_interrupted_writes_leave_nothing_after_the_next_start(tmp_path):
    stale = ['.model_last.state.k2j4_x9a.tmp', '.model_best.params.abcdefgh.tmp', '.report.json.12345678.tmp',
             '.model_prev.state.prevlink.tmp']
    kept = ['.other.abcdefgh.tmp', 'model_last.state', '.model_last.state.tmp']
    for name in stale + kept:
        (tmp_path / name).write_bytes(b'x')
    args = argparse.Namespace(workspace=str(tmp_path), model_prefix='model')
    Workspace.of(args).clean()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_write_failures_are_clear_errors_and_keep_the_old_file(tmp_path):
    """A file-size limit (as a full disk does) makes MXNet's writer fail mid-file: one clear error, the
    previous checkpoint intact, no temporary left."""
    script = f"""
import resource, signal, sys
sys.path.insert(0, {ROOT!r})
import mxnet as mx
from rn50 import files
from rn50.errors import RecipeError
path = {str(tmp_path / 'model_last.state')!r}
mx.nd.save(path, {{'a': mx.nd.ones((10,))}})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    with files.atomic_path(path) as tmp:
        mx.nd.save(tmp, {{'a': mx.nd.ones((100000,))}})
except RecipeError as e:
    print('error:', e)
"""
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith(f'error: could not write {tmp_path / "model_last.state"}'), result.stderr
    assert 'previous version of the file is unchanged' in result.stdout
    assert mx.nd.load(str(tmp_path / 'model_last.state'))['a'].shape == (10,)
    assert [p.name for p in tmp_path.iterdir()] == ['model_last.state']


def test_workspace_that_is_a_file_is_refused(tmp_path):
    (tmp_path / 'plain').write_text('x')
    with pytest.raises(RecipeError, match='is a file, not a folder'):
        files.check_workspace(str(tmp_path / 'plain'))
    with pytest.raises(RecipeError, match='is not writable'):
        files.check_workspace(str(tmp_path / 'plain' / 'below'))


CPU_ARGS = argparse.Namespace(rgb_mean=(123.68, 116.779, 103.939), rgb_std=(58.393, 57.12, 57.375))


def small_resnet(classes=10, layers=18, drawn=True):
    """A ResNet with the recipe's initial weights, or zeros (not `drawn`) where only the arrays' shapes matter."""
    net = models.get_model(num_layers=layers, num_classes=classes, image_shape=(3, 32, 32))
    if not drawn:
        return allocated(net)
    net.initialize()
    return net


def test_mismatched_checkpoint_is_a_clear_error(tmp_path):
    path = str(tmp_path / 'w.params')
    small_resnet(layers=34, drawn=False).save_parameters(path)
    args = CPU_ARGS
    with pytest.raises(RecipeError, match='the network is a ResNet-18: pass --num-layers 34'):
        weight_loading.load_weights(small_resnet(drawn=False), path, args.rgb_mean, args.rgb_std)
    small_resnet(classes=2, drawn=False).save_parameters(path)
    with pytest.raises(RecipeError, match='2-class classifier, the network 10 classes'):
        weight_loading.load_weights(small_resnet(drawn=False), path, args.rgb_mean, args.rgb_std)


def test_finetuning_loads_everything_but_a_classifier_of_another_width(tmp_path):
    source = small_resnet(classes=10)
    path = str(tmp_path / 'w.params')
    source.save_parameters(path)
    target = small_resnet(classes=2)
    fresh = {n: p.data().asnumpy() for n, p in target._collect_params_with_prefix().items()}
    args = CPU_ARGS
    weight_loading.load_weights(target, path, args.rgb_mean, args.rgb_std, finetune=True)
    loaded = {n: p.data().asnumpy() for n, p in target._collect_params_with_prefix().items()}
    original = {n: p.data().asnumpy() for n, p in source._collect_params_with_prefix().items()}
    for name, value in loaded.items():
        if name.startswith('output.'):
            np.testing.assert_array_equal(value, fresh[name])          # the new classifier stays fresh
        else:
            np.testing.assert_array_equal(value, original[name])


def test_a_state_that_does_not_record_a_setting_resumes_and_one_that_does_is_checked(caplog):
    """States written before --end-lr and the LARS, poly and --eval-period settings were recorded resume (not
    'None in the saved run'), saying which values they took (a state older than --mixup-mode went on with
    today's default silently); a state that records them refuses a command that changes one."""
    from conftest import resolved
    args = resolved(['--lr-schedule', 'poly', '--optimizer', 'lars'])
    old = {name: value for name, value in resume.run_settings(args, fit.RESUMED_SETTINGS).items()
           if name not in ('lr_poly_power', 'end_lr', 'lars_eta', 'lars_eps', 'eval_period', 'eval_offset',
                           'mixup_mode', 'auto_augment_fill')}
    with caplog.at_level('INFO'):
        resume.check_same_run(resume.TrainingStart.of(args, fit.RESUMED_SETTINGS), {'settings': old}, 'old.state')
    assert ('old.state does not record --lr-poly-power, --end-lr, --lars-eta, --lars-eps, --mixup-mode, '
            '--auto-augment-fill, --eval-period, --eval-offset (written before the recipe recorded them): the run goes '
            'on with this command\'s, as if the run had them: --lr-poly-power 2.0, --end-lr 0.0001, --lars-eta 0.001, '
            '--lars-eps 0.0, --mixup-mode elem, --auto-augment-fill 0.0, --eval-period 1, --eval-offset 0') \
        in caplog.text
    recorded = resume.run_settings(args, fit.RESUMED_SETTINGS)
    for flag, value in (('lars_eta', 0.002), ('lr_poly_power', 1.0), ('eval_period', 4), ('mixup_mode', 'batch'),
                        ('warmup_prefix', 0), ('ra_prob', 0.5), ('auto_augment_fill', '1.0,2.0,3.0'),
                        ('batchnorm_eps', 0.001), ('batchnorm_mom', 0.99), ('num_groups', 16)):
        changed = resolved(['--lr-schedule', 'poly', '--optimizer', 'lars', f'--{flag.replace("_", "-")}', str(value)])
        with pytest.raises(RecipeError, match=f'--{flag.replace("_", "-")} .* in the saved run, '):
            resume.check_same_run(resume.TrainingStart.of(changed, fit.RESUMED_SETTINGS), {'settings': recorded},
                                  'new.state')
    # a per-channel fill recorded as JSON (a list) is the same setting as the flag's (a tuple)
    import json
    fill = resolved(['--auto-augment-fill', '124,116,104'])
    recorded = json.loads(json.dumps(resume.run_settings(fill, fit.RESUMED_SETTINGS)))
    resume.check_same_run(resume.TrainingStart.of(fill, fit.RESUMED_SETTINGS), {'settings': recorded}, 'fill.state')


def test_a_resume_on_a_backend_that_resizes_otherwise_for_validation_is_refused():
    """A run validated with DALI's antialiased resize, resumed with --data-backend mxnet (plain linear), would
    validate its remaining epochs, and choose its best, on other images: refused, naming the backends that
    resize as the run did. Another DALI backend (dali-gpu's run resumed on a CPU with dali-cpu) resumes."""
    from conftest import resolved
    def start(backend):
        return resume.TrainingStart.of(resolved(['--data-backend', backend]), fit.RESUMED_SETTINGS)
    dali = start('dali-gpu').settings
    resume.check_same_run(start('dali-cpu'), {'settings': dali}, 'gpu.state')
    with pytest.raises(RecipeError, match=r'validation resized with linear-antialias interpolation in the saved run, '
                                          r'linear now \(--data-backend mxnet; --data-backend dali-cpu or dali-gpu'):
        resume.check_same_run(start('mxnet'), {'settings': dali}, 'dali.state')
    imagerecorditer = dict(start('mxnet').settings)
    with pytest.raises(RecipeError, match=r'linear interpolation in the saved run, linear-antialias now'):
        resume.check_same_run(start('dali-cpu'), {'settings': imagerecorditer}, 'mx.state')
    del imagerecorditer['val_interpolation']           # a state from before the interpolation was recorded
    resume.check_same_run(start('dali-cpu'), {'settings': imagerecorditer}, 'old.state')


def step_once(net, trainer):
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)


def test_a_state_written_in_the_background_is_the_one_of_the_moment_it_was_asked_for(tmp_path, monkeypatch):
    """fit.py's files are written while the next epoch trains: the copies are made when the save is asked for,
    so the steps that follow (here, five, before the writer may start) are not in the file, which is byte for
    byte the file written at once. Weights, the optimizer's momenta, an extra array and the meta."""
    import threading
    net = tiny_net()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    step_once(net, trainer)
    average = {'ema:w': mx.nd.ones((2,)) / 4}
    at_once, later = str(tmp_path / 'at_once.state'), str(tmp_path / 'later.state')
    checkpoint.save_state(at_once, net, trainer, {'epoch': 1}, extra=average)
    held = threading.Event()
    monkeypatch.setattr(checkpoint, 'write_state', lambda *args, original=checkpoint.write_state: (
        held.wait(60), original(*args)))
    with checkpoint.BackgroundWriter() as writer:
        checkpoint.save_state(later, net, trainer, {'epoch': 1}, extra=average, writer=writer)
        meta = {'epoch': 1}
        meta['epoch'] = 2                 # the caller's dict changes too
        for _ in range(5):
            step_once(net, trainer)
        average['ema:w'] += 1
        held.set()
    with open(at_once, 'rb') as a, open(later, 'rb') as b:
        assert a.read() == b.read()


def test_a_background_write_that_fails_is_an_error_that_leaves_the_old_file(tmp_path, monkeypatch):
    """A full disk in the writer's thread: the training thread gets its error at the next wait, the file is the
    old one, and the files queued after it are not written."""
    net = tiny_net()
    path, params = str(tmp_path / 'm_last.state'), str(tmp_path / 'm_best.params')
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    step_once(net, trainer)
    checkpoint.save_state(path, net, trainer, {'epoch': 1})
    with open(path, 'rb') as f:
        before = f.read()

    def full(tmp, arrays):
        raise mx.base.MXNetError('write failed')
    monkeypatch.setattr(mx.nd, 'save', full)
    writer = checkpoint.BackgroundWriter()
    checkpoint.save_state(path, net, trainer, {'epoch': 2}, writer=writer)
    checkpoint.save_params(net, params, writer)
    with pytest.raises(RecipeError, match=r'could not write .*m_last\.state: write failed'):
        writer.wait()
    writer.wait()    # reported once
    with open(path, 'rb') as f:
        assert f.read() == before
    assert not os.path.exists(params) and [p.name for p in tmp_path.iterdir()] == ['m_last.state']


class OtherWorkers:
    """The collectives of one worker of `size` (a workers.Communicator's allreduce_sum and broadcast_text) whose
    other workers' writes are failed, or not, as `failed` says by rank, and say `words`."""

    def __init__(self, rank, size, failed, words=''):
        self.rank, self.size, self.failed, self.words = rank, size, failed, words

    def allreduce_sum(self, values):
        return np.array([value if rank == self.rank else float(self.failed[rank]) for rank, value in enumerate(values)])

    def broadcast_text(self, text, root=0):
        return text if root == self.rank else self.words


def test_a_failed_background_write_is_raised_on_every_worker_in_its_own_words(tmp_path):
    """Issue 57 item 5, wait_agreed: a worker whose files were written raises the error of the first worker
    whose write failed, in its words; that worker raises its own; where none failed nothing is raised."""
    said = f'could not write {tmp_path / "m_last.state"}: No space left on device'
    writer = checkpoint.BackgroundWriter()
    with pytest.raises(RecipeError) as error:
        writer.wait_agreed(OtherWorkers(1, 2, [True, False], said))
    assert str(error.value) == said
    writer.wait_agreed(OtherWorkers(1, 2, [False, False]))

    def full():
        raise RecipeError(said)
    writer.submit(full)
    writer.threads[0].join()
    assert writer.failed      # seen without waiting (fit.stop_agreed looks every --disp-batches steps)
    with pytest.raises(RecipeError, match='No space left on device'):
        writer.wait_agreed(OtherWorkers(0, 2, [False, False]))
    assert not writer.failed


@pytest.mark.parametrize('on_gpu', [False, True])
def test_the_replica_fingerprint_tells_workers_apart(on_gpu):
    """The workers' check after each epoch compares sums computed where the arrays are (MXNet's kernels on GPUs,
    numpy on the CPU) instead of a SHA-256 of host copies: equal for equal replicas; different for one weight
    changed by a thousandth, a momentum changed, or one more update count on one device."""
    def replica():
        mx.random.seed(3)
        net = tiny_net()
        trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
        step_once(net, trainer)
        return net, trainer
    reference = optimizer_state.replica_fingerprint(*replica(), on_gpu)
    assert reference.dtype == np.float32
    np.testing.assert_array_equal(optimizer_state.replica_fingerprint(*replica(), on_gpu), reference)
    net, trainer = replica()
    weight = net[0].weight.data()
    weight[0, 0] = weight[0, 0] * 1.001
    assert not np.array_equal(optimizer_state.replica_fingerprint(net, trainer, on_gpu), reference)
    net, trainer = replica()
    trainer._updaters[0].states[0][:] *= 1.001
    assert not np.array_equal(optimizer_state.replica_fingerprint(net, trainer, on_gpu), reference)
    net, trainer = replica()
    trainer._optimizer._all_index_update_counts[0][0] += 1
    assert not np.array_equal(optimizer_state.replica_fingerprint(net, trainer, on_gpu), reference)


@pytest.mark.unit
def test_a_states_progress_is_one_record_written_and_read_back_as_before():
    """saver.Progress is what a state's meta records of where the run stands (the keys the states held when the
    epoch loop wrote a dict): written and read back unchanged; the measures not taken yet left out; a state
    of an earlier version that lacks a key reads as a new run's value for it."""
    from rn50.checkpoints.saver import Progress
    progress = Progress(epoch=3)
    assert progress.meta() == {'epoch': 3, 'iteration': 0, 'best_accuracy': None, 'history': [], 'loss_sum': 0.0,
                               'loss_count': 0, 'seed': None}
    progress.loss_sum, progress.loss_count, progress.seed, progress.wall_seconds = 2.5, 5, 7, 12.0
    progress.finish_epoch({'val.accuracy': 0.5})
    assert (progress.epoch, progress.iteration, progress.loss_sum, progress.loss_count) == (4, 0, 0.0, 0)
    progress.ema_best_accuracy = 0.25
    meta = json.loads(json.dumps(progress.meta()))
    assert meta == {'epoch': 4, 'iteration': 0, 'best_accuracy': None, 'history': [{'val.accuracy': 0.5, 'epoch': 3}],
                    'loss_sum': 0.0, 'loss_count': 0, 'seed': 7, 'wall_seconds': 12.0, 'ema_best_accuracy': 0.25}
    assert Progress.of_meta(dict(meta, workers=2, global_batch=64)) == progress
    assert Progress.of_meta({'epoch': 1, 'iteration': 5, 'best_accuracy': 0.1, 'history': [], 'loss_sum': 1.0,
                             'loss_count': 2}).seed is None
