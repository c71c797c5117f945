"""Checkpoints: every file of weights or training state this recipe reads or writes, and which one to use.

Written by the recipe, in the workspace, atomically (logs.atomic_path: a temporary name flushed to disk, then
a rename, so a crash leaves the old file or the new one, never half of one):

* `<prefix>_best.params`, `<prefix>_NNNN.params`: Gluon `save_parameters` files (weights and batchnorm
  statistics, by the network's structural names such as `features.stage2.unit1.body.conv2.weight`).
* `<prefix>_last.state`: everything an exact resume needs, one `mx.nd.save` dictionary: `param:<name>`
  arrays, `rank<r>:<name>` batchnorm statistics of every worker (with several workers), `trainer` (the
  optimizer state as bytes), `meta` (JSON bytes: epoch, iteration, seed, loss scaler, global batch, workers,
  best accuracy, metric history, the epoch's loss sums, preprocessing), with --model-ema the `ema:<name>`
  float32 averages (ema.py), and `checksum` (SHA-256 of all of it). Each new one keeps the one it replaces as `<prefix>_prev.state`, the fallback if the last is damaged.
  Never written with NaN or infinite parameters (fit.py checks first).
* `<prefix>_ema_best.params` (--model-ema): the weight average on its own best top-1, same format.
* --keep-checkpoints N keeps the newest N `<prefix>_NNNN.params` (prune_epoch_params, after each new one).

Read for weights (`--load`, val, pred, INT8, export, fine-tuning): those files, and any parameter dictionary
weights.py recognises (`.params` of NVIDIA's original recipe or GluonCV, torchvision/timm `.safetensors` or
`.npz`), converted to the network's layout, stem width and precision:

    path = checkpoint.find_weights(args)                 # --load, else best, else last state
    checkpoint.load_weights(net, path, args)             # any format, logged: what was recognised/converted
    state = checkpoint.read_state(checkpoint.last_state_path(args))     # .params, .trainer, .meta
"""
import collections
import hashlib
import json
import logging
import os
import re
import zipfile

import mxnet as mx
import numpy as np

from rn50.reports import logs
from rn50.checkpoints import optimizer_state
from rn50.checkpoints import weights
from rn50.errors import RecipeError, mxnet_message
from rn50.data import validation_resize

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = ('.params', '.safetensors', '.npz')

class State(collections.namedtuple('State', 'params trainer meta worker_statistics extra')):
    """A .state file's contents: parameters by name (NDArrays), the optimizer state (bytes), the meta dict,
    {rank: {name: numpy array}} of every worker's batchnorm statistics (empty with one worker), and the other
    named arrays of optional features ({'ema:<name>': NDArray}); `checksum`, the file's SHA-256 (hex), tells
    the workers of a run whether they read the same state."""
    checksum = None

    def __new__(cls, params, trainer, meta, worker_statistics, extra=None, checksum=None):
        state = super().__new__(cls, params, trainer, meta, worker_statistics, {} if extra is None else extra)
        state.checksum = checksum
        return state


EXTRA_PREFIXES = ('ema:',)


def last_state_path(args):
    return logs.in_workspace(args, f'{args.model_prefix}_last.state')


def previous_state_path(args):
    return logs.in_workspace(args, f'{args.model_prefix}_prev.state')


def best_params_path(args):
    return logs.in_workspace(args, f'{args.model_prefix}_best.params')


def epoch_params_path(args, epoch):
    return logs.in_workspace(args, f'{args.model_prefix}_{epoch:04d}.params')


def ema_best_params_path(args):
    return logs.in_workspace(args, f'{args.model_prefix}_ema_best.params')


def prune_epoch_params(args):
    """--keep-checkpoints N: delete all but the newest N `<prefix>_NNNN.params` of the workspace (by epoch
    number; 0 keeps all). Called after a new one is written (atomically), so a crash at any moment leaves
    at least the N newest."""
    if not args.keep_checkpoints:
        return
    folder = logs.in_workspace(args, '.')
    pattern = re.compile(re.escape(args.model_prefix) + r'_([0-9]{4,})\.params$')
    epochs = sorted(int(m.group(1)) for m in map(pattern.match, os.listdir(folder)) if m)
    for epoch in epochs[:-args.keep_checkpoints]:
        os.remove(epoch_params_path(args, epoch))
        log.info('Removed %s (--keep-checkpoints %d)', epoch_params_path(args, epoch), args.keep_checkpoints)


def clean_workspace(args):
    """Remove the half-written temporaries of a run killed during a write (its outputs only)."""
    folder = logs.in_workspace(args, '.')
    removed = logs.remove_stale_temporaries(folder, (f'{args.model_prefix}_', 'report.json'))
    if removed:
        log.info('Removed %d temporary files left by an interrupted write: %s', len(removed), ', '.join(removed))


# ----------------------------------------------------------------------------------------------------------
# Writing


def save_params(net, path):
    """Gluon parameter file, written atomically."""
    with logs.atomic_path(path) as tmp:
        net.save_parameters(tmp)


def nonfinite_parameters(net):
    """Names of the parameters holding NaN or infinite values (one pass over the weights: cheap per save)."""
    return [name for name, param in net._collect_params_with_prefix().items()
            if not np.isfinite(param._reduce().asnumpy()).all()]


def bytes_array(data):
    return mx.nd.array(np.frombuffer(data, dtype=np.uint8), dtype='uint8')


def checksum(arrays):
    """SHA-256 over the names and bytes of every array but 'checksum' itself, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        if name != 'checksum':
            value = arrays[name].asnumpy()
            digest.update(name.encode() + str(value.dtype).encode() + str(value.shape).encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def save_state(path, net, trainer, meta, previous=None, worker_statistics=None, extra=None):
    """One file with everything an exact resume needs: parameters (by their save_parameters names), every
    worker's batchnorm statistics (`worker_statistics`: {rank: {name: array}}), the gluon.Trainer's optimizer
    state, `meta` as JSON, the `extra` named arrays (names starting with one of EXTRA_PREFIXES) and a
    checksum; written atomically, the replaced file kept as `previous`."""
    arrays = {f'param:{name}': p._reduce() for name, p in net._collect_params_with_prefix().items()}
    for rank, statistics in (worker_statistics or {}).items():
        arrays.update({f'rank{rank}:{name}': mx.nd.array(value) for name, value in statistics.items()})
    # mx.nd.save records each array's device and mx.nd.load recreates it there: CPU arrays only, so that a
    # resume allocates nothing on the device that rank 0 saved from (the weight average lives on a GPU).
    arrays.update({name: value.as_in_context(mx.cpu()) for name, value in (extra or {}).items()})
    arrays['trainer'] = bytes_array(optimizer_state.trainer_state_bytes(trainer))
    arrays['meta'] = bytes_array(json.dumps(logs.finite_or_none(meta)).encode())
    arrays['checksum'] = bytes_array(checksum(arrays).encode())
    with logs.atomic_path(path, previous=previous) as tmp:
        mx.nd.save(tmp, arrays)


# ----------------------------------------------------------------------------------------------------------
# Reading


def read_state(path, fallback=None):
    """The State of a .state file, its checksum verified; a truncated or corrupt file is a RecipeError that
    names `fallback` (the previous state) when it exists."""
    def damaged(reason):
        keep = f'; the previous good state is {fallback}: resume from it with --load {fallback}' \
            if fallback and os.path.exists(fallback) else ''
        return RecipeError(f'{path} is damaged ({reason}){keep}')
    try:
        arrays = mx.nd.load(path)
    except mx.base.MXNetError as e:
        raise damaged(f'truncated or corrupt: {mxnet_message(e)}') from None
    if not isinstance(arrays, dict) or not {'meta', 'trainer', 'checksum'} <= set(arrays):
        raise RecipeError(f'{path} is not a .state file written by this version of the recipe')
    stored = arrays['checksum'].asnumpy().tobytes().decode()
    if stored != checksum(arrays):
        raise damaged('its checksum does not match its contents')
    params = {name[len('param:'):]: value for name, value in arrays.items() if name.startswith('param:')}
    meta = json.loads(arrays['meta'].asnumpy().tobytes().decode())
    statistics = {}
    for name, value in arrays.items():
        if name.startswith('rank'):
            rank, _, param = name[len('rank'):].partition(':')
            statistics.setdefault(int(rank), {})[param] = value.asnumpy()
    extra = {name: value for name, value in arrays.items() if name.startswith(EXTRA_PREFIXES)}
    return State(params, arrays['trainer'].asnumpy().tobytes(), meta, statistics, extra, stored)


def read_arrays(path):
    """name -> numpy array of a weights file: `.params` (MXNet `save_parameters` / `mx.nd.save` dictionary),
    `.state` (this recipe's training state), `.safetensors` (the safetensors package's NumPy API, no
    PyTorch) or `.npz`. A missing, truncated or corrupt file, a file without parameter names, or another
    suffix is a RecipeError whose message names the file and the reason (never MXNet's traceback text)."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in WEIGHT_SUFFIXES + ('.state',):
        raise RecipeError(f'{path}: unknown weights format {suffix or "(no suffix)"!r}; expected one of '
                          f'{", ".join(WEIGHT_SUFFIXES + (".state",))} (a PyTorch .pth/.pt pickle needs PyTorch: '
                          'save it as .safetensors first)')
    if not os.path.isfile(path):
        raise RecipeError(f'weights file {path} does not exist')
    if suffix == '.state':
        return {name: value.asnumpy() for name, value in read_state(path).params.items()}
    reader = {'.params': read_params_file, '.safetensors': read_safetensors, '.npz': read_npz}[suffix]
    arrays = reader(path)
    if not arrays:
        raise RecipeError(f'{path} holds no arrays')
    return arrays


def read_params_file(path):
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as e:
        raise RecipeError(f'{path} is not a readable MXNet parameter file (truncated or corrupt?): '
                          f'{mxnet_message(e)}') from None
    if not isinstance(loaded, dict):
        raise RecipeError(f'{path} holds a list of {len(loaded)} arrays without names, not a parameter '
                          'dictionary (save it with save_parameters or mx.nd.save of a dict)')
    return {name: value.asnumpy() for name, value in loaded.items()}


def read_safetensors(path):
    from safetensors.numpy import load_file
    try:
        return dict(load_file(path))
    except Exception as e:     # SafetensorError (header, truncation), TypeError/ValueError (dtypes)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if 'bf16' in reason.lower() or 'bfloat16' in reason.lower():
            raise RecipeError(f'{path} holds bfloat16 tensors, which NumPy (and so this reader) cannot represent: '
                              'save the weights as float32') from None
        raise RecipeError(f'{path} is not a readable .safetensors file (truncated or corrupt?): {reason}') from None


def read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RecipeError(f'{path} is not a readable .npz archive of arrays (truncated or corrupt?): '
                          f'{reason}') from None


# ----------------------------------------------------------------------------------------------------------
# Loading into a network


def load_params_into(net, params, ctx):
    """Copy {name: array} with exactly the network's names and shapes into its parameters (initialised or
    not), on the devices `ctx`, in the parameters' dtypes."""
    own = net._collect_params_with_prefix()
    for name, value in params.items():
        value = value if isinstance(value, mx.nd.NDArray) else mx.nd.array(value, dtype=value.dtype)
        own[name]._load_init(value.astype(own[name].dtype), ctx)


def load_weights(net, path, args, finetune=False):
    """Weights of any format read_arrays reads and weights.py recognises into `net`, converted to its
    layout, stem width and precision; one log line says what was recognised and converted, another which
    input normalisation the weights expect when it is not this run's. With `finetune`, a classifier of
    another width than the network's is left out, so the network's keeps its fresh initialisation."""
    arrays = read_arrays(path)
    origin = weights.recognise(arrays)
    classes = net._collect_params_with_prefix()['output.weight'].shape[0]
    new_classifier = finetune and origin.num_classes not in (None, classes)
    params, description = weights.convert(arrays, net, new_classifier=new_classifier, source=path)
    load_params_into(net, params, args.contexts)
    log.info('Loaded %s', description)
    expected = weights.normalisation(origin)
    if not (np.allclose(expected['mean'], args.rgb_mean) and np.allclose(expected['std'], args.rgb_std)):
        log.warning('These weights were trained with input mean %s and std %s, this run normalises with %s and '
                    '%s: for the same preprocessing pass %s', expected['mean'], expected['std'],
                    tuple(args.rgb_mean), tuple(args.rgb_std), expected['flags'])


def worker_statistics(net, world):
    """{rank: {name: array}} of every worker's batchnorm running statistics (they differ between workers:
    each normalises its own batches); None with one worker. A collective: every worker must call it."""
    if world.size == 1:
        return None
    own = [(name, p) for name, p in net._collect_params_with_prefix().items() if p.grad_req == 'null']
    flat = np.concatenate([p._reduce().asnumpy().astype(np.float32).ravel() for _, p in own])
    rows = world.gather(flat)
    statistics = {}
    for rank, row in enumerate(rows):
        offset, statistics[rank] = 0, {}
        for name, param in own:
            size = int(np.prod(param.shape))
            statistics[rank][name] = row[offset:offset + size].reshape(param.shape)
            offset += size
    return statistics


def restore_worker_statistics(net, world, statistics, saved_workers):
    """This worker's own batchnorm statistics from the state, so a multi-worker resume is exact."""
    if world.size == 1:
        return
    if saved_workers != world.size or world.rank not in statistics:
        log.warning('The state holds batchnorm statistics of %d workers, this run has %d: every worker starts '
                    "from rank 0's (the resume is not exact)", saved_workers, world.size)
        return
    own = net._collect_params_with_prefix()
    for name, value in statistics[world.rank].items():
        own[name].set_data(mx.nd.array(value, dtype=own[name].dtype))


def find_weights(args):
    """The checkpoint evaluation and prediction use: --load, else the workspace's best, else its last state."""
    candidates = [args.load] if args.load else [best_params_path(args), last_state_path(args)]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise RecipeError(f'no trained weights: {" or ".join(candidates)} not found. Pass --load with a weights '
                      'file (this mode refuses to run on random weights)')


def set_aside_if_damaged(path):
    """Rename a damaged state to `<path>.damaged` (kept for inspection), so that the next save, which keeps
    the state it replaces as the previous one (the fallback), finds none to keep. Used when a run resumes
    from another state, e.g. --load model_prev.state after the error naming it. Several processes may do it
    at once on one file (the workers of a run on a shared workspace): one moves it, the others find it gone."""
    try:
        read_state(path)
    except RecipeError as e:
        try:
            os.replace(path, path + '.damaged')
        except FileNotFoundError:
            log.info('%s was set aside by another worker', path)
            return
        log.warning('%s; moved it to %s.damaged so that it never becomes the fallback', e, path)


def agreed_training_start(args, net, world):
    """training_start on every worker of `world`, which must all start from rank 0's choice (the same state
    file content, epoch, iteration and seed, or all a new run), else every worker stops with the same error:
    each worker reads its own --workspace and --load, so a resume needs them on a filesystem the nodes share.
    A worker that fails alone would leave the others waiting in a collective: the outcome is agreed first."""
    failure = state = None
    try:
        state = training_start(args, net, set_aside=world.rank == 0)
    except RecipeError as e:
        failure = e
    own = start_fingerprint(state)
    # One all-reduce: how many workers failed, and rank 0's choice (a broadcast, as in workers.World).
    totals = world.allreduce_sum([failure is not None] + (own if world.rank == 0 else [0] * len(own)))
    failed, chosen = int(totals[0]), [int(value) for value in totals[1:]]
    if failure is not None:
        raise failure
    if failed:
        raise RecipeError(f'{failed} of {world.size} workers could not open the checkpoint this run starts from (their '
                          f'error is above): {SHARED_WORKSPACE_RULE}')
    others = int(world.allreduce_sum([own != chosen])[0])
    if others:
        what = (f'resumes from its {os.path.basename(last_state_path(args))} or --load state at epoch {chosen[1]}, '
                f'iteration {chosen[2]}' if chosen[0] else 'starts a new run (no state in its workspace)')
        raise RecipeError(f'the workers would not start from the same state: worker 0 {what}, and {others} of the '
                          f'{world.size} workers see another state or none. {SHARED_WORKSPACE_RULE}')
    return state


SHARED_WORKSPACE_RULE = ('Every worker reads the state to resume from its own --workspace (and --load), so with '
                         'several nodes the workspace must be on a filesystem they share, at the same path on '
                         'every node (the default ./ is usually node-local): e.g. --workspace /shared/runs/rn50')


def start_fingerprint(state):
    """What every worker must agree on before training: [resumes, epoch, iteration, seed + 1, the first 52
    bits of the state's checksum] (all zero for a new run); integers a float64 all-reduce keeps exactly."""
    if state is None:
        return [0, 0, 0, 0, 0]
    seed = state.meta.get('seed')
    return [1, state.meta['epoch'], state.meta['iteration'], 0 if seed is None else seed + 1,
            int(state.checksum[:13], 16)]


# What changes a run's result, recorded in its state: a resume must have the same (the global batch and the
# worker count may change, as resume() says; --wd and --mom too, the flags win). The learning rate is compared
# only at the same global batch, since the runner scales it with the batch.
RUN_SETTINGS = ('data_train', 'num_classes', 'arch', 'num_layers', 'image_shape', 'num_epochs', 'lr_schedule',
                'lr_steps', 'lr_factor', 'warmup_epochs', 'optimizer', 'dtype', 'amp', 'label_smoothing', 'mixup',
                'cutmix', 'mixup_switch_prob', 'grad_accum_steps', 'lr_poly_power', 'end_lr', 'lars_eta', 'lars_eps',
                'eval_period', 'eval_offset', 'drop_path', 'bce_loss', 'bce_target_thresh', 'auto_augment',
                'ra_magnitude', 'ra_num_ops', 'random_erase', 'random_erase_mode', 'aug_repeats', 'progressive_size',
                'progressive_epochs', 'progressive_step', 'mixup_mode', 'warmup_prefix', 'ra_magnitude_scale',
                'ra_magnitude_std', 'ra_prob', 'ra_ops', 'auto_augment_fill')


def run_settings(args):
    """The settings of RUN_SETTINGS as the state records them (JSON values; the data file as an absolute path)."""
    settings = {name: getattr(args, name, None) for name in RUN_SETTINGS}
    settings['data_train'] = None if args.data_backend == 'synthetic' or not args.data_train else \
        os.path.abspath(args.data_train)
    settings['image_shape'] = list(args.image_shape)
    settings['lr_steps'] = list(args.lr_steps)
    settings['progressive_epochs'] = list(args.progressive_epochs) if args.progressive_epochs else None
    fill = getattr(args, 'auto_augment_fill', None)
    settings['auto_augment_fill'] = list(fill) if isinstance(fill, tuple) else fill
    settings['lr'], settings['global_batch'] = args.lr, args.batch_size
    settings['data_val_resize'] = args.data_val_resize     # what val, pred and export take (trained_settings.py)
    settings['val_image_shape'] = list(args.val_image_shape) if args.val_image_shape else None
    settings['val_interpolation'] = validation_resize.val_interpolation(args)      # the validation resize's, the backend's
    return settings


def check_same_run(args, meta, path):
    """RecipeError listing every setting in which this command differs from the run whose state `path` is
    (a workspace holds one run: resuming another's state would train it with the wrong settings, or not at
    all). A setting a state does not record (one written before the recipe recorded it) is not checked."""
    saved, now = meta.get('settings'), run_settings(args)
    if saved is None:
        return
    names = [name for name in RUN_SETTINGS if name in saved and saved[name] != now[name]]
    if saved.get('global_batch') == now['global_batch'] and saved.get('lr') != now['lr']:
        names.append('lr')
    if names:
        differences = '; '.join(f'--{name.replace("_", "-")} {saved.get(name)} in the saved run, {now[name]} now'
                                for name in names)
        raise RecipeError(f'{path} belongs to a run with other settings ({differences}). A workspace holds one '
                          f'run: give this one a new --workspace, or move {os.path.basename(path)} away to start '
                          f'over here. To continue that run with these settings (more epochs, say), start a new '
                          f'workspace from its state: --load {path} --workspace NEW_FOLDER')


def training_start(args, net, set_aside=True):
    """Where training starts: the State to resume, or None for a new run, with the weights already in `net`.
    One rule: the workspace's last state is resumed when it exists, whatever weights --load names (with or
    without --finetune: an interrupted run rerun with its own command continues); only --load of a .state
    file (without --finetune) resumes that state instead. Else --load gives the weights of a new run (with
    --finetune every layer but a classifier of another width); else the fresh initialisation stays.
    `set_aside`: whether this process may set a damaged last state aside (one worker of a run does it)."""
    last = last_state_path(args)
    explicit_state = bool(args.load and args.load.endswith('.state') and not args.finetune)
    # A --benchmark-iters run measures afresh every time: a finished state in its workspace would leave it
    # nothing to train (benchmark.py's points, or a sweep of runs in one folder, reported stale numbers).
    resume = os.path.exists(last) and not explicit_state and not args.benchmark_iters
    if resume or explicit_state:
        path = last if resume else args.load
        log.info('Resuming from %s%s', path, f' (the workspace\'s state wins over --load {args.load}: give another '
                 '--workspace to start again from it)' if resume and args.load else '')
        if set_aside and not resume and os.path.exists(last) and os.path.abspath(last) != os.path.abspath(path):
            set_aside_if_damaged(last)
        state = read_state(path, fallback=previous_state_path(args))
        if resume:
            check_same_run(args, state.meta, path)
        load_params_into(net, weights.convert(state.params, net, source=path)[0], args.contexts)
        log.info('Loaded %s: epoch %d, iteration %d', path, state.meta['epoch'], state.meta['iteration'])
        return state
    if args.load is None:
        return None
    if not os.path.exists(args.load):
        raise RecipeError(f'--load {args.load}: no such file')
    load_weights(net, args.load, args, finetune=args.finetune)
    return None
