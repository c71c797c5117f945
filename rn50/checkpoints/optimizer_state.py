"""The optimizer's state (gluon.Trainer's Updaters: momentum, float32 master weights, step counts): saved as
CPU bytes in Gluon's format, restored on every device of every worker, and the digest by which the workers
check after each epoch that they still hold one model.

    state = optimizer_state.trainer_state_bytes(trainer)          # in checkpoint.save_state's .state file
    optimizer_state.restore_trainer_state(trainer, state)        # fit.resume
    optimizer_state.check_replicas(net, trainer, world, epoch)   # fit.train, after each epoch (a collective)
"""
import contextlib
import hashlib
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
    updater = trainer_updaters(trainer)[0]
    return pickle.dumps((on_device(updater.states, mx.cpu()), updater.optimizer))


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


def on_device(value, ctx):
    """`value` (an NDArray, or nested tuples/lists/dicts of them, as optimizers keep their state) on `ctx`."""
    if isinstance(value, mx.nd.NDArray):
        return value.as_in_context(ctx)
    if isinstance(value, dict):
        return {key: on_device(item, ctx) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(item, ctx) for item in value)
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


def replica_digest(net, trainer):
    """SHA-256 (bytes) over what every worker must hold alike after an epoch (its batchnorm statistics
    averaged): every copy of every parameter and batchnorm statistic, the optimizer's step counts of each
    device and the optimizer state of each device. Workers that differ train different models and validate
    a mixture of them while rank 0's is saved."""
    digest = hashlib.sha256()

    def add(value):
        if isinstance(value, mx.nd.NDArray):
            digest.update(np.ascontiguousarray(value.asnumpy()).tobytes())
        elif isinstance(value, (tuple, list)):
            for item in value:
                add(item)

    for name, param in sorted(net._collect_params_with_prefix().items()):
        digest.update(name.encode())
        add(param.list_data())
    counts = trainer._optimizer._all_index_update_counts
    for ctx in trainer._contexts:
        digest.update(repr(sorted(counts.get(ctx.device_id, {}).items())).encode())
    for updater in trainer_updaters(trainer):
        for index in sorted(updater.states):
            add(updater.states[index])
    return digest.digest()


def check_replicas(net, trainer, world, epoch):
    """RecipeError on every worker when the workers' copies of the model differ after an epoch (weights,
    batchnorm statistics, optimizer counts or state): a defect of the recipe, never to go on silently. Said in
    the log when they agree. A collective."""
    if world.size == 1:
        return
    digest = replica_digest(net, trainer)
    differing = world.differing_ranks(digest)
    if differing:
        raise RecipeError(f'after epoch {epoch} the model of worker(s) {", ".join(map(str, differing))} differs '
                          'from rank 0\'s (weights, batchnorm statistics or optimizer state): the workers no '
                          'longer train one model. This is a defect of the recipe: please report it with the log. '
                          f'The state of epoch {epoch} was written from rank 0\'s')
    log.info('[Epoch %d] All %d workers hold the same weights, batchnorm statistics and optimizer state '
             '(SHA-256 %s)', epoch, world.size, digest.hex()[:16])
