"""Checkpoints: every file of weights or training state this recipe writes or reads, and which one to use.

Two formats, both in the workspace, both written atomically (logs.atomic_path: a temporary name, then a
rename, so a crash leaves the old file or the new one, never half of one):

* `<prefix>_best.params`, `<prefix>_NNNN.params`: Gluon `save_parameters` files (weights and batchnorm
  statistics, by the network's structural names such as `features.stage2.unit1.body.conv2.weight`).
* `<prefix>_last.state`: everything an exact resume needs, one `mx.nd.save` dictionary: `param:<name>`
  arrays, `trainer` (the Gluon trainer's optimizer state as bytes) and `meta` (JSON bytes: epoch,
  iteration, seed, loss scale, best accuracy, metric history, the epoch's loss sums).

    path = checkpoint.find_weights(args)               # --load, else best, else last state
    checkpoint.load_weights(net, path, args.contexts)  # either format into a network
    params, trainer_state, meta = checkpoint.read_state(checkpoint.last_state_path(args))
"""
import json
import logging
import os
import tempfile

import mxnet as mx
import numpy as np

import logs
from errors import RecipeError

log = logging.getLogger(__name__)


def last_state_path(args):
    return logs.in_workspace(args, f'{args.model_prefix}_last.state')


def best_params_path(args):
    return logs.in_workspace(args, f'{args.model_prefix}_best.params')


def epoch_params_path(args, epoch):
    return logs.in_workspace(args, f'{args.model_prefix}_{epoch:04d}.params')


def save_params(net, path):
    """Gluon parameter file, written atomically."""
    with logs.atomic_path(path) as tmp:
        net.save_parameters(tmp)


def trainer_state_bytes(trainer):
    """The optimizer state of a gluon.Trainer (momentum, ...) as bytes (Gluon only writes it to a file)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'trainer.states')
        trainer.save_states(path)
        with open(path, 'rb') as f:
            return f.read()


def restore_trainer_state(trainer, state):
    """The inverse of trainer_state_bytes."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'trainer.states')
        with open(path, 'wb') as f:
            f.write(state)
        trainer.load_states(path)


def bytes_array(data):
    return mx.nd.array(np.frombuffer(data, dtype=np.uint8), dtype='uint8')


def save_state(path, net, trainer, meta):
    """One file with everything an exact resume needs: parameters (by their save_parameters names), the
    gluon.Trainer's optimizer state and `meta` as JSON, written atomically."""
    arrays = {f'param:{name}': p._reduce() for name, p in net._collect_params_with_prefix().items()}
    arrays['trainer'] = bytes_array(trainer_state_bytes(trainer))
    arrays['meta'] = bytes_array(json.dumps(meta).encode())
    with logs.atomic_path(path) as tmp:
        mx.nd.save(tmp, arrays)


def read_state(path):
    """(parameters by name, trainer state bytes, meta dict) of a .state file; clear errors if it is not one."""
    try:
        arrays = mx.nd.load(path)
    except mx.base.MXNetError as e:
        raise RecipeError(f'{path} is not a readable checkpoint (truncated or corrupt?): '
                          f'{str(e).splitlines()[0]}') from e
    if not isinstance(arrays, dict) or 'meta' not in arrays or 'trainer' not in arrays:
        raise RecipeError(f'{path} is not a .state file written by this recipe')
    params = {name[len('param:'):]: value for name, value in arrays.items() if name.startswith('param:')}
    meta = json.loads(arrays['meta'].asnumpy().tobytes().decode())
    return params, arrays['trainer'].asnumpy().tobytes(), meta


def load_params_into(net, params, ctx, source):
    """Copy named arrays into the network's parameters, casting dtypes; clear error on a mismatch."""
    own = net._collect_params_with_prefix()
    missing = sorted(set(own) - set(params))
    unexpected = sorted(set(params) - set(own))
    if missing or unexpected:
        raise RecipeError(f'{source} does not match this network ({len(missing)} parameters missing, e.g. '
                          f'{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}): check --arch, '
                          '--num-layers, --num-classes and --image-shape')
    for name, param in own.items():
        value = params[name]
        if param.shape is not None and all(param.shape) and tuple(param.shape) != value.shape:
            raise RecipeError(f'{source}: parameter {name} has shape {value.shape}, the network expects '
                              f'{param.shape}: check --num-classes, --image-shape and the layouts')
        param._load_init(value.astype(param.dtype), ctx)


def load_weights(net, path, ctx):
    """Weights from a .params or .state file into an initialised-or-not network."""
    if not os.path.exists(path):
        raise RecipeError(f'checkpoint {path} does not exist')
    if path.endswith('.state'):
        params, _, _ = read_state(path)
    else:
        try:
            params = mx.nd.load(path)
        except mx.base.MXNetError as e:
            raise RecipeError(f'{path} is not a readable parameter file: {str(e).splitlines()[0]}') from e
    load_params_into(net, params, ctx, path)
    log.info('Loaded weights from %s', path)


def find_weights(args):
    """The checkpoint evaluation and prediction use: --load, else the workspace's best, else its last state."""
    candidates = [args.load] if args.load else [best_params_path(args), last_state_path(args)]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise RecipeError(f'no trained weights: {" or ".join(candidates)} not found. Pass --load with a '
                      '.params or .state file (this mode refuses to run on random weights)')


def training_start(args, net):
    """Where training starts: (meta of a resumed state or None, trainer state bytes or None), with the
    weights of --load or of the workspace's last state (automatic resume) already in `net`."""
    path = args.load
    if path is None and os.path.exists(last_state_path(args)):
        path = last_state_path(args)
        log.info('Resuming from %s', path)
    if path is None:
        return None, None
    if not os.path.exists(path):
        raise RecipeError(f'--load {path}: no such file')
    if path.endswith('.state'):
        params, trainer_state, meta = read_state(path)
        load_params_into(net, params, args.contexts, path)
        log.info('Loaded %s: epoch %d, iteration %d', path, meta['epoch'], meta['iteration'])
        return meta, trainer_state
    load_weights(net, path, args.contexts)
    return None, None
