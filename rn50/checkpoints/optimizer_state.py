"""The optimizer's state (gluon.Trainer's Updaters: momentum, float32 master weights, step counts): saved as
CPU bytes in Gluon's format, restored on every device of every worker, and the digest by which the workers
check after each epoch that they still hold one model.

    state = optimizer_state.trainer_state_bytes(trainer)          # in checkpoint.save_state's .state file
    optimizer_state.restore_trainer_state(trainer, state)        # saver.Saver.resume
    optimizer_state.take_flags(trainer._optimizer, wd=wd, mom=mom)   # the flags win over the resumed state's
    optimizer_state.check_replicas(net, trainer, world, epoch)   # fit.train, after each epoch (a collective)
"""
import contextlib
import io
import logging
import os
import pickle
import tempfile

import mxnet as mx
import numpy as np

from rn50.errors import RecipeError
from rn50.optim import lars

log = logging.getLogger(__name__)


def trainer_updaters(trainer):
    """The Updaters holding a gluon.Trainer's optimizer state, one per device (with update_on_kvstore, one
    device, --kv-store device or local, the kvstore's), after Gluon has created them."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters


def trainer_state_bytes(trainer):
    """The optimizer state of a gluon.Trainer (momentum, float32 master weights, ...) as bytes, every array
    on the CPU, in the format of Gluon's save_states: a pickled (states of the first device, optimizer).
    The CPU copy is made from the Updater's arrays directly: pickling Gluon's own file and unpickling it
    recreated every array on the device it came from, a second copy of the optimizer state (200-300 MB for
    ResNet-50) in rank 0's GPU memory at every save. (Gluon pickles each NDArray with its device, and a state
    resumed as saved would put every worker's copy on rank 0's GPU.)"""
    return state_bytes(*trainer_state_copy(trainer))


def trainer_state_copy(trainer):
    """(the first device's optimizer state copied to the CPU, the optimizer pickled): what trainer_state_bytes
    holds, taken now (the copies are queued: MXNet's engine orders them before any later update), for
    state_bytes to pickle later (checkpoint.save_state in the background)."""
    updater = trainer_updaters(trainer)[0]
    return on_device(updater.states, mx.cpu(), copy=True), pickle.dumps(updater.optimizer)


def state_bytes(states, optimizer):
    """trainer_state_bytes of trainer_state_copy's (states, pickled optimizer)."""
    return pickle.dumps((states, pickle.loads(optimizer)))


def restore_trainer_state(trainer, state):
    """The inverse of trainer_state_bytes: each device's optimizer state on that device at once (Gluon would
    otherwise keep the unpickled arrays and copy them at the first update), and the optimizer's per-step
    counts for every device of this worker."""
    with trainer_state_file() as path:
        with open(path, 'wb') as f:
            f.write(state)
        try:
            trainer.load_states(path)
        except ModuleNotFoundError:     # written before the recipe's modules moved into rn50/
            with open(path, 'wb') as f:
                f.write(with_current_modules(state))
            trainer.load_states(path)
    updaters = trainer_updaters(trainer)
    for updater, ctx in zip(updaters, trainer._contexts):
        updater.states = {index: on_device(value, ctx) for index, value in updater.states.items()}
        updater.states_synced = dict.fromkeys(updater.states, True)
    restore_update_counts(trainer._optimizer, trainer._contexts)
    lars.upgrade_loaded_state(trainer._optimizer, updaters)


# The flags a resumed optimizer takes from the command instead of the state: flag -> the optimizer's attribute.
FLAGS_OVER_STATE = {'wd': 'wd', 'mom': 'momentum'}


def take_flags(optimizer, **values):
    """A resumed `optimizer` with this command's values (`wd`, `mom`: FLAGS_OVER_STATE's flags) where it has
    that attribute and the state held another, said in the log: the flags win over the state."""
    for flag, value in values.items():
        attribute = FLAGS_OVER_STATE[flag]
        if hasattr(optimizer, attribute) and getattr(optimizer, attribute) != value:
            log.info('--%s %g (the resumed state had %g): using the flag', flag, value, getattr(optimizer, attribute))
            setattr(optimizer, attribute, value)


# Where the modules a .state's pickled optimizer names by module (its LARS or LAMB) live since rn50/.
MOVED_MODULES = {'lars': 'rn50.optim.lars', 'lamb': 'rn50.optim.lamb'}


class CurrentModules(pickle.Unpickler):
    def find_class(self, module, name):
        return super().find_class(MOVED_MODULES.get(module, module), name)


def with_current_modules(state):
    """The optimizer state of a .state written before the modules moved into rn50/ (its LARS pickled as
    lars.MLPerfLARS, which no module provides now), pickled again with today's module names."""
    return pickle.dumps(CurrentModules(io.BytesIO(state)).load())


def restore_update_counts(optimizer, contexts):
    """MXNet keeps an optimizer's update count of every array per device id (`_all_index_update_counts`,
    switched by the Updater to the device of the arrays it updates), and the saved state holds those of the
    devices of the process that saved it (rank 0: gpu(0)). A worker on gpu(k), k > 0, found no count for its
    device and started again at step 1: LAMB's and Adam's bias corrections restarted on every worker but
    rank 0, whose replicas then drifted apart. Every device of this worker gets the saved counts (those of
    the saving process's devices are equal: each applies the same steps)."""
    saved = optimizer._all_index_update_counts
    counts = {}
    for device_counts in saved.values():
        for index, count in device_counts.items():
            counts[index] = max(count, counts.get(index, 0))
    optimizer._all_index_update_counts = {ctx.device_id: dict(counts) for ctx in contexts}
    optimizer._index_update_count = optimizer._all_index_update_counts[contexts[0].device_id]


def on_device(value, ctx, copy=False):
    """`value` (an NDArray, or nested tuples/lists/dicts of them, as optimizers keep their state) on `ctx`; with
    `copy`, new arrays even where they are on `ctx` already (a snapshot that later updates leave alone)."""
    if isinstance(value, mx.nd.NDArray):
        return value.copyto(ctx) if copy else value.as_in_context(ctx)
    if isinstance(value, dict):
        return {key: on_device(item, ctx, copy) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(item, ctx, copy) for item in value)
    return value


@contextlib.contextmanager
def trainer_state_file():
    """A temporary file for the optimizer state; a failure to write or read it (full disk, file-size limit
    in the temporary folder) is a RecipeError that says where, not a traceback."""
    try:
        with tempfile.TemporaryDirectory() as folder:
            yield os.path.join(folder, 'trainer.states')
    except OSError as e:
        raise RecipeError(f'could not pass the optimizer state through a temporary file in {tempfile.gettempdir()} '
                          f'({e.strerror or e}): free space there, raise the file-size limit, or point TMPDIR at '
                          'another folder') from e


def replica_fingerprint(net, trainer, on_gpu):
    """A float32 vector of what every worker must hold alike after an epoch (its batchnorm statistics averaged):
    the sum and the sum of squares of every copy of every parameter and batchnorm statistic and of each
    device's optimizer state (array_sums: on the GPUs with `on_gpu`), and the optimizer's step counts of each
    device. Workers that differ train different models and validate a mixture of them while rank 0's is saved;
    a difference too small to change a float32 sum grows within a few steps into one that does (a later
    epoch's check sees it)."""
    arrays = [array for _, param in sorted(net._collect_params_with_prefix().items()) for array in param.list_data()]
    for updater in trainer_updaters(trainer):
        for index in sorted(updater.states):
            arrays += flat_arrays(updater.states[index])
    counts = trainer._optimizer._all_index_update_counts
    steps = [count for ctx in trainer._contexts for _, count in sorted(counts.get(ctx.device_id, {}).items())]
    return np.concatenate([array_sums(arrays, on_gpu), np.asarray(steps, dtype=np.float32)])


def array_sums(arrays, on_gpu):
    """Each array's sum, then each one's sum of squares, in float32. On GPUs MXNet's kernels compute them there
    and only the sums reach the host (not the 250 MB of a ResNet-50's weights and optimizer state); on the CPU
    numpy reads the arrays where they are (MXNet's CPU reductions took 0.44 s for ResNet-50, SHA-256 of the
    arrays 0.2 s, numpy's sums less)."""
    if not on_gpu:
        values = [array.asnumpy().astype(np.float32, copy=False).ravel() for array in arrays]
        return np.array([v.sum() for v in values] + [np.dot(v, v) for v in values], dtype=np.float32)
    sums = []
    by_device = {}
    for array in arrays:
        by_device.setdefault(array.context, []).append(array.reshape(-1).astype('float32', copy=False))
    for flat in by_device.values():
        totals = mx.nd.stack(*[mx.nd.sum(array) for array in flat]).reshape(-1)
        squares = mx.nd.concat(*[mx.nd.multi_sum_sq(*flat[i:i + 60], num_arrays=len(flat[i:i + 60]))
                                 for i in range(0, len(flat), 60)], dim=0)
        sums.append(mx.nd.concat(totals, squares, dim=0).asnumpy())
    return np.concatenate(sums)


def flat_arrays(state):
    """The NDArrays of an optimizer state (an NDArray, None, or nested tuples and lists of them)."""
    if isinstance(state, mx.nd.NDArray):
        return [state]
    if isinstance(state, (tuple, list)):
        return [array for part in state for array in flat_arrays(part)]
    return []


def check_replicas(net, trainer, world, epoch):
    """RecipeError on every worker when the workers' copies of the model differ after an epoch (weights,
    batchnorm statistics, optimizer counts or state): a defect of the recipe, never to go on silently. Said in
    the log when they agree. A collective."""
    if world.size == 1:
        return
    fingerprint = replica_fingerprint(net, trainer, world.devices.kind == 'gpu')
    differing = world.comm.differing_ranks(fingerprint)
    if differing:
        raise RecipeError(f'after epoch {epoch} the model of worker(s) {", ".join(map(str, differing))} differs '
                          'from rank 0\'s (weights, batchnorm statistics or optimizer state): the workers no '
                          'longer train one model. This is a defect of the recipe: please report it with the log. '
                          f'The state of epoch {epoch} was written from rank 0\'s')
    log.info('[Epoch %d] All %d workers hold the same weights, batchnorm statistics and optimizer state '
             '(%d sums alike)', epoch, world.size, fingerprint.size)
