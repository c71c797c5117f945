"""Training, validation, prediction, checkpoints and logs: everything after the model and the data exist.

`train.py` builds the network (models.py) and hands it, with a data-loader factory (data.py / dali.py), to
`fit(args, net, world, get_loaders)`. Typical commands (through the runner, which adds the derived flags):

    ./runner -n 8 -b 192                                   # train and validate every epoch (mode train_val)
    ./runner -n 8 -b 192 --mode val --load model_best.params   # one validation pass
    ./runner --mode pred --data-pred cat.jpg               # top-5 classes of one image (or a folder)
    ./runner --mode export                                 # symbol+params and ONNX (inference.py)
    python train.py --data-backend synthetic --test-io     # the data loader alone, images/s

What happens in a training run, in order:
1. `resolve_hardware` (called by train.py before the model exists): devices, precision and AMP, data backend.
2. The state to start from: `--load FILE` (a .params file or a .state file), else the workspace's
   `<prefix>_last.state` (automatic resume), else fresh initialisation.
3. Per epoch: iterations with the learning rate `learning_rate(...)`, a pure function of (epoch, iteration);
   validation (train_val); then checkpoints: `<prefix>_NNNN.params` every --save-frequency epochs,
   `<prefix>_best.params` on a new best top-1, and always `<prefix>_last.state`, which holds everything an
   exact resume needs (parameters, optimizer state, loss scale, epoch and iteration, best accuracy, metric
   history and the seed that fixes the data order and mixup draws). Every file is written to a temporary
   name and renamed.
4. SIGTERM or SIGUSR1 stops the run at the next iteration boundary (the next --disp-batches boundary with
   several workers, which must agree), writes the last state and exits 0; the next run resumes from there.
"""
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import inference
import logs
from errors import RecipeError

log = logging.getLogger(__name__)

# Optimizers whose MXNet implementation takes a momentum argument.
MOMENTUM_OPTIMIZERS = ('sgd', 'nag', 'signum', 'dcasgd', 'lbsgd')


def int_list(text):
    return [int(x) for x in text.split(',') if x.strip() != '']


def float_list(text):
    return [float(x) for x in text.split(',') if x.strip() != '']


def add_fit_args(parser):
    group = parser.add_argument_group('Training', 'model training')
    group.add_argument('--mode', default='train_val', choices=['train_val', 'train', 'val', 'pred', 'export'],
                       help='train_val trains and validates every epoch; train only trains (checkpoints are '
                            'still written); val validates a checkpoint; pred classifies --data-pred; export writes '
                            'symbol+params and ONNX')
    group.add_argument('--seed', type=int, default=None,
                       help='random seed for initialisation, data order, augmentation and mixup (default: a '
                            'random one, logged and stored in the checkpoint so a resume continues exactly)')
    group.add_argument('--gpus', type=int_list, default=None,
                       help='list of gpus to run, e.g. 0 or 0,2,5; with --kv-store horovod each worker takes '
                            'gpus[local rank] (default: GPU 0, or the CPU on a machine without GPUs)')
    group.add_argument('--kv-store', default='device', choices=['device', 'horovod'],
                       help='horovod: one process per device (use the runner); device: one process drives '
                            'every device in --gpus')
    group.add_argument('--dtype', default=None, choices=['float32', 'float16'],
                       help='precision of weights and data (default: float16 on GPU, float32 on CPU)')
    group.add_argument('--amp', action='store_true',
                       help='automatic mixed precision (mxnet.contrib.amp): float16 on GPU with dynamic loss '
                            'scaling, bfloat16 on CPU; weights stay float32')
    group.add_argument('--batch-size', type=int, default=192, help='the GLOBAL batch size (all workers)')
    group.add_argument('--num-epochs', type=int, default=None,
                       help='number of epochs, the length of the schedule (default 90); in val mode the '
                            'number of validation passes (default 1)')
    group.add_argument('--run-epochs', type=int, default=-1,
                       help='run at most this many epochs in this invocation (-1: no limit); the schedule '
                            'still spans --num-epochs')
    group.add_argument('--lr', type=float, default=0.1, help='peak learning rate (the runner scales it)')
    group.add_argument('--lr-schedule', default='cosine', choices=['multistep', 'cosine'],
                       help='learning rate schedule after the warmup')
    group.add_argument('--lr-factor', type=float, default=0.256,
                       help='the ratio to reduce lr on each step (multistep) or cosine segment')
    group.add_argument('--lr-steps', type=float_list, default=[],
                       help='the epochs to reduce the lr, e.g. 30,60')
    group.add_argument('--warmup-epochs', type=float, default=5,
                       help='epochs of linear warmup from 0 to --lr')
    group.add_argument('--optimizer', default='sgd', help='any MXNet optimizer name')
    group.add_argument('--mom', type=float, default=0.875, help='momentum (sgd, nag, signum, dcasgd, lbsgd)')
    group.add_argument('--wd', type=float, default=1 / 32768,
                       help='weight decay; never applied to batchnorm gamma/beta or biases')
    group.add_argument('--label-smoothing', type=float, default=0.1, help='label smoothing factor')
    group.add_argument('--mixup', type=float, default=0,
                       help='alpha parameter for mixup (if 0 then mixup is not applied)')
    group.add_argument('--disp-batches', type=int, default=20, help='log progress every n batches')
    group.add_argument('--model-prefix', default='model', help='checkpoint file name prefix')
    group.add_argument('--save-frequency', type=int, default=-1,
                       help='write <prefix>_NNNN.params every N epochs; -1: only <prefix>_best.params; '
                            '0: no .params files. <prefix>_last.state is always written')
    group.add_argument('--begin-epoch', type=int, default=None,
                       help='start from this epoch (with --load of a .params file, or to shift the schedule)')
    group.add_argument('--load', default=None,
                       help='checkpoint to start from: a .params file (weights) or a .state file (exact '
                            'resume); default: the workspace\'s last state, if any')
    group.add_argument('--test-io', action='store_true', help='measure the data loader alone, images/s')
    group.add_argument('--test-io-mode', default='train', choices=['train', 'val'],
                       help='which data --test-io reads')
    group.add_argument('--log', default='log.log',
                       help='human-readable log file (relative paths are in the workspace)')
    group.add_argument('--dllogger-log', default='dllogger_log.log',
                       help='DLLogger JSON-lines file (relative paths are in --logdir, else the workspace)')
    group.add_argument('--workspace', default='./', help='directory for checkpoints, logs and report.json')
    group.add_argument('--logdir', default=None, help='directory for the DLLogger file')
    group.add_argument('--no-metrics', action='store_true',
                       help='do not compute accuracy (for benchmarking)')
    group.add_argument('--benchmark-iters', type=int, default=None,
                       help='run only this many iterations per epoch, wrapping around the data if needed')
    group.add_argument('--topk', type=int, default=5, help='pred mode: how many classes to print')
    group.add_argument('--classes', default=None,
                       help='pred mode: classes.json naming the classes (default: the one beside '
                            '--data-train/--data-val, else ImageNet names for 1000 classes)')
    group.add_argument('--pred-output', default=None, help='pred mode: write the predictions to this JSON file')
    return group


# ----------------------------------------------------------------------------------------------------------
# Workers and devices


class World:
    """Who this process is among the workers, and the two collectives fit needs (sum and stop agreement).

    With --kv-store horovod there is one worker per device; otherwise a single worker."""

    def __init__(self, kv_store):
        self.horovod = None
        self.rank, self.size, self.local_rank = 0, 1, 0
        if kv_store == 'horovod':
            try:
                # DALI must be loaded before Horovod: the other order makes DALI pipelines crash (seen with
                # DALI 1.34 and Horovod 0.28.1: segfault at the first pipeline run, conflicting native libs).
                import nvidia.dali  # noqa: F401
            except ImportError:
                pass
            try:
                import horovod.mxnet as hvd
            except ImportError as e:
                raise RecipeError(f'--kv-store horovod needs Horovod built with MXNet support ({e}); run '
                                  '`make setup`, or use --kv-store device for a single process') from e
            hvd.init()
            self.horovod = hvd
            self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()

    def allreduce_sum(self, values):
        """Sum a small float64 vector over all workers (identity with one worker)."""
        values = np.asarray(values, dtype=np.float64)
        if self.size == 1:
            return values
        total = self.horovod.allreduce(mx.nd.array(values, dtype='float64'), op=self.horovod.Sum,
                                       name=f'sum{len(values)}')
        return total.asnumpy()

    def barrier(self):
        """Wait until every worker gets here."""
        self.allreduce_sum([0.0])

    def broadcast_int(self, value):
        """Rank 0's value of an integer, on every worker."""
        if self.size == 1:
            return value
        array = self.horovod.broadcast(mx.nd.array([value], dtype='float64'), root_rank=0, name='bcast_int')
        return int(array.asnumpy()[0])


def resolve_hardware(args, world):
    """Decide devices, precision and AMP before the model is built; defaults adapt to the machine (and say
    so once), explicit requests this machine cannot honour are errors. Sets args.contexts."""
    num_gpus = mx.context.num_gpus()
    if args.gpus is not None and any(g >= num_gpus for g in args.gpus):
        raise RecipeError(f'--gpus {",".join(map(str, args.gpus))} asks for GPUs this machine does not have '
                          f'({num_gpus} found); leave --gpus out to train on the CPU')
    if num_gpus == 0:
        if args.gpus is None:
            log.info('No GPU found: running on the CPU')
        args.contexts = [mx.cpu()]
    else:
        gpus = args.gpus if args.gpus is not None else list(range(num_gpus if world.size == 1 else 1))
        if args.kv_store == 'horovod':
            if world.local_rank >= len(gpus):
                raise RecipeError(f'worker with local rank {world.local_rank} has no GPU in --gpus {gpus}')
            gpus = [gpus[world.local_rank]]
        args.contexts = [mx.gpu(g) for g in gpus]
    on_gpu = num_gpus > 0

    if args.dtype is None:
        args.dtype = 'float16' if on_gpu and not args.amp else 'float32'
        if not on_gpu:
            log.info('No GPU: --dtype defaults to float32 (use --amp for bfloat16 on this CPU)')
    if args.dtype == 'float16' and not on_gpu:
        raise RecipeError('--dtype float16 needs a GPU (MXNet has no fast float16 kernels on CPU); use '
                          '--dtype float32, or --amp for bfloat16 mixed precision on the CPU')
    if args.amp:
        if args.dtype == 'float16':
            log.info('--amp: the network stays float32 and AMP casts to float16 where it is safe')
        args.dtype = 'float32'
        args.amp_dtype = 'float16' if on_gpu else 'bfloat16'
        if args.amp_dtype == 'bfloat16':
            check_cpu_bfloat16()
        from mxnet.contrib import amp
        amp.init(target_dtype=args.amp_dtype)
    else:
        args.amp_dtype = None
    args.device = 'gpu' if on_gpu else 'cpu'
    if args.batch_size % world.size:
        raise RecipeError(f'--batch-size {args.batch_size} (the global batch) is not divisible by the '
                          f'{world.size} workers')
    per_worker = args.batch_size // world.size
    if per_worker % len(args.contexts):
        raise RecipeError(f'the per-worker batch {per_worker} is not divisible by its '
                          f'{len(args.contexts)} devices')


def cpu_flags():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()


def check_cpu_bfloat16():
    """oneDNN runs bfloat16 natively with avx512_bf16 or AMX, emulated on other AVX-512 CPUs, not at all on
    AVX2-only CPUs (it fails deep inside with 'could not create a primitive descriptor')."""
    flags = cpu_flags()
    if flags & {'avx512_bf16', 'amx_bf16'}:
        return
    if 'avx512f' in flags:
        log.warning('This CPU has no native bfloat16 (avx512_bf16 or AMX): oneDNN emulates it, --amp may be '
                    'slower than float32')
        return
    raise RecipeError('--amp on the CPU means bfloat16, which needs an AVX-512 CPU (native with avx512_bf16 or '
                      'AMX) and this CPU has neither: train in float32 (leave out --amp)')


def resolve_seed(args, world):
    """One seed for every worker: the given one, else rank 0's random pick (logged, stored in checkpoints)."""
    if args.seed is None:
        args.seed = world.broadcast_int(int.from_bytes(os.urandom(3), 'little'))
        log.info('No --seed given: using seed %d', args.seed)
    np.random.seed(args.seed)
    mx.random.seed(args.seed + world.rank)


# ----------------------------------------------------------------------------------------------------------
# Learning rate, targets, loss scaling


def learning_rate(progress, base_lr, num_epochs, warmup_epochs=0, schedule='cosine', steps=(), factor=0.1):
    """The learning rate at `progress` = epoch + iteration / iterations_per_epoch (a pure function).

    Linear warmup from 0 over `warmup_epochs`, then either
    - cosine: half a cosine from base_lr to 0 at num_epochs; with `steps`, the span is cut into segments at
      those epochs and each segment k restarts the cosine from base_lr * factor**k;
    - multistep: base_lr * factor**(number of steps <= progress).
    """
    if progress >= num_epochs:
        return 0.0
    decays = sum(1 for s in steps if s <= progress)
    if progress < warmup_epochs:
        scale = factor ** decays if schedule == 'multistep' else 1.0
        return base_lr * scale * progress / warmup_epochs
    if schedule == 'multistep':
        return base_lr * factor ** decays
    bounds = [warmup_epochs] + [s for s in steps if warmup_epochs < s < num_epochs] + [num_epochs]
    segment = max(k for k in range(len(bounds) - 1) if bounds[k] <= progress)
    start, end = bounds[segment], bounds[segment + 1]
    return base_lr * factor ** segment * 0.5 * (1 + math.cos(math.pi * (progress - start) / (end - start)))


def smoothed_one_hot(labels, num_classes, smoothing):
    """Dense targets: 1 - smoothing + smoothing/K for the label, smoothing/K elsewhere."""
    off = smoothing / num_classes
    return mx.nd.one_hot(labels, num_classes, on_value=1 - smoothing + off, off_value=off)


def mixup(images, targets, lam):
    """Per-sample mixup: sample i is blended with sample B-1-i with weight lam[i] (an NDArray of shape (B,))."""
    lam_images = lam.reshape((-1,) + (1,) * (images.ndim - 1)).astype(images.dtype)
    mixed_images = lam_images * images + (1 - lam_images) * images[::-1]
    lam_targets = lam.reshape((-1, 1))
    mixed_targets = lam_targets * targets + (1 - lam_targets) * targets[::-1]
    return mixed_images, mixed_targets


def mixup_weights(seed, epoch, iteration, rank, part, size, alpha):
    """The Beta(alpha, alpha) draws of one device's batch, a function of where in training we are, so a
    resumed run draws exactly what an uninterrupted one would."""
    rng = np.random.default_rng([seed, epoch, iteration, rank, part])
    return rng.beta(alpha, alpha, size=size).astype(np.float32)


class DynamicLossScale:
    """Loss scaling for --dtype float16 without AMP: multiply the loss so small float16 gradients survive,
    skip the step and halve the scale when a gradient overflows, double it after `interval` clean steps."""

    def __init__(self, scale=2.0 ** 16, interval=2000):
        self.scale = scale
        self.interval = interval
        self.clean_steps = 0
        self.skipped = 0

    def overflowed(self, params):
        """Check the (already all-reduced) gradients and update the scale; True means skip this step."""
        grads = [g for p in params if p.grad_req != 'null' for g in p.list_grad()]
        finite = mx.nd.ones((1,), ctx=grads[0].context)
        for i in range(0, len(grads), 200):
            chunk = grads[i:i + 200]
            mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=finite)
        if finite.asscalar() == 0:
            self.scale /= 2
            self.clean_steps = 0
            self.skipped += 1
            log.info('float16 gradient overflow: step skipped, loss scale lowered to %g', self.scale)
            return True
        self.clean_steps += 1
        if self.clean_steps == self.interval:
            self.scale *= 2
            self.clean_steps = 0
        return False


# ----------------------------------------------------------------------------------------------------------
# Checkpoints


def workspace_path(args, name):
    return os.path.join(args.workspace, name)


def last_state_path(args):
    return workspace_path(args, f'{args.model_prefix}_last.state')


def save_params(net, path):
    """Gluon parameter file, written atomically."""
    with logs.atomic_path(path) as tmp:
        net.save_parameters(tmp)


def save_state(path, net, trainer, meta):
    """One file with everything an exact resume needs: parameters (by their save_parameters names), the
    trainer's optimizer state (momentum, ...), and `meta` (epoch, iteration, seed, loss scale, best accuracy,
    history) as JSON. It is an mx.nd.save dictionary, written atomically."""
    arrays = {f'param:{name}': p._reduce() for name, p in net._collect_params_with_prefix().items()}
    with tempfile.TemporaryDirectory() as tmpdir:
        states_file = os.path.join(tmpdir, 'trainer.states')
        trainer.save_states(states_file)
        with open(states_file, 'rb') as f:
            arrays['trainer'] = mx.nd.array(np.frombuffer(f.read(), dtype=np.uint8), dtype='uint8')
    arrays['meta'] = mx.nd.array(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), dtype='uint8')
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
    candidates = [args.load] if args.load else [workspace_path(args, f'{args.model_prefix}_best.params'),
                                                 last_state_path(args)]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise RecipeError(f'no trained weights: {" or ".join(candidates)} not found. Pass --load with a '
                      '.params or .state file (this mode refuses to run on random weights)')


# ----------------------------------------------------------------------------------------------------------
# Progress and timing


class Progress:
    """A one-line progress bar with images/s and ETA when stderr is a terminal; nothing otherwise (the
    periodic DLLogger lines serve as progress in log files)."""

    def __init__(self, total, label, enabled):
        self.total, self.label, self.enabled = total, label, enabled and sys.stderr.isatty()
        self.start = time.time()

    def update(self, done, images_per_second):
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / max(self.total, 1))
        elapsed = time.time() - self.start
        eta = elapsed / max(done, 1) * (self.total - done)
        sys.stderr.write(f'\r{self.label} [{"=" * filled}{" " * (width - filled)}] {done}/{self.total} '
                         f'{images_per_second:8.1f} img/s ETA {int(eta // 60)}:{int(eta % 60):02d} ')
        sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write('\n')


def steady_durations(durations):
    """Drop each epoch's warm-up iterations (min(10%, 100), and at least the first, which includes graph
    building) before averaging."""
    if len(durations) <= 1:
        return durations
    return durations[max(1, min(len(durations) // 10, 100)):]


def batches(loader, epoch, start, count):
    """`count` batches of `epoch` from index `start`, wrapping around the data when count exceeds the epoch
    (only --benchmark-iters asks for that)."""
    produced = 0
    while produced < count:
        for batch in loader.epoch(epoch, start):
            yield batch
            produced += 1
            if produced == count:
                return
        start = 0


# ----------------------------------------------------------------------------------------------------------
# Training and validation


class StopRequest:
    """SIGTERM/SIGUSR1 set a flag; training stops at the next iteration boundary all workers agree on."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        log.warning('Signal %d received: stopping at the next iteration boundary', signum)
        self.requested = True


class Trainer:
    """The training step for one worker: forward and backward on each of its devices, loss scaling, update.

    It also keeps what the checkpoints need (seed, loss scale) and the loss sums of the current epoch."""

    def __init__(self, args, net, world):
        self.args, self.net, self.world = args, net, world
        self.contexts = args.contexts
        self.sparse_labels = args.label_smoothing == 0 and args.mixup == 0
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=self.sparse_labels)
        self.loss.hybridize(static_alloc=True, static_shape=True)
        optimizer_params = {'learning_rate': 0.0, 'wd': args.wd,
                            'multi_precision': args.dtype == 'float16'}
        if args.optimizer in MOMENTUM_OPTIMIZERS:
            optimizer_params['momentum'] = args.mom
        params = net.collect_params()
        try:
            if world.horovod is not None:
                self.trainer = world.horovod.DistributedTrainer(params, args.optimizer, optimizer_params)
            else:
                self.trainer = gluon.Trainer(params, args.optimizer, optimizer_params,
                                             kvstore=args.kv_store if len(self.contexts) > 1 else None,
                                             update_on_kvstore=False if len(self.contexts) > 1 else None)
        except (ValueError, KeyError, mx.base.MXNetError) as e:
            raise RecipeError(f'--optimizer {args.optimizer}: {e}') from e
        self.amp_scaling = args.amp_dtype == 'float16'
        if self.amp_scaling:
            from mxnet.contrib import amp
            amp.init_trainer(self.trainer)
        self.loss_scale = DynamicLossScale() if args.dtype == 'float16' and not args.amp else None

    def targets(self, labels, epoch, iteration, part, images):
        """Labels as the loss wants them: sparse, smoothed one-hot, or mixed up with the images."""
        if self.sparse_labels:
            return images, labels
        targets = smoothed_one_hot(labels, self.args.num_classes, self.args.label_smoothing)
        if self.args.mixup > 0:
            lam = mixup_weights(self.args.seed, epoch, iteration, self.world.rank, part, labels.shape[0],
                                self.args.mixup)
            images, targets = mixup(images, targets, mx.nd.array(lam, ctx=images.context))
        return images, targets

    def step(self, batch, epoch, iteration, lr):
        """One optimisation step; returns the batch's mean loss as an NDArray (not synchronised)."""
        self.trainer.set_learning_rate(lr)
        images = gluon.utils.split_and_load(batch.data[0], self.contexts, even_split=True)
        labels = gluon.utils.split_and_load(batch.label[0], self.contexts, even_split=True)
        with autograd.record():
            losses = []
            for part, (x, y) in enumerate(zip(images, labels)):
                x, target = self.targets(y, epoch, iteration, part, x)
                losses.append(self.loss(self.net(x), target))
            if self.amp_scaling:
                from mxnet.contrib import amp
                with amp.scale_loss(losses, self.trainer) as scaled:
                    autograd.backward(scaled)
            elif self.loss_scale is not None:
                autograd.backward([loss * self.loss_scale.scale for loss in losses])
            else:
                autograd.backward(losses)
        local_batch = batch.data[0].shape[0]
        if self.loss_scale is None:
            self.trainer.step(local_batch)
        else:
            # All-reduce first so every worker sees the same gradients and makes the same skip decision.
            self.trainer.allreduce_grads()
            if not self.loss_scale.overflowed(self.net.collect_params().values()):
                self.trainer.update(local_batch * self.loss_scale.scale)
        return mx.nd.add_n(*[loss.mean().as_in_context(self.contexts[0]) for loss in losses]) / len(losses)

    @property
    def skips_bad_steps(self):
        """With loss scaling a non-finite loss is an overflow to skip, not a divergence to stop on."""
        return self.amp_scaling or self.loss_scale is not None


def check_finite(loss_value, epoch, iteration, trainer, args):
    if not math.isfinite(loss_value) and not trainer.skips_bad_steps:
        raise RecipeError(f'the training loss became {loss_value} at epoch {epoch} iteration {iteration}: '
                          f'training stopped. The last good state is {last_state_path(args)} (if it '
                          'exists); lower --lr, add --warmup-epochs, or check the data')


def train_epoch(args, trainer, loader, epoch, start_batch, progress_state, dllogger, stop):
    """Run the iterations of one epoch from `start_batch`; returns (next batch index, durations, stopped).

    The host reads the loss of the previous iteration while the current one runs: that one-step lag keeps
    the device busy (no per-iteration sync) yet catches a NaN within an iteration."""
    iterations = args.benchmark_iters or loader.num_batches
    global_batch = loader.batch_size * trainer.world.size
    durations, window_loss, window_count = [], 0.0, 0
    previous = None
    progress = Progress(iterations, f'Epoch {epoch}', trainer.world.rank == 0)
    tick = window_start = time.time()
    iteration = start_batch
    stopped = False
    for iteration, batch in enumerate(batches(loader, epoch, start_batch, iterations - start_batch),
                                      start_batch):
        lr = learning_rate(epoch + iteration / iterations, args.lr, args.num_epochs, args.warmup_epochs,
                           args.lr_schedule, args.lr_steps, args.lr_factor)
        loss = trainer.step(batch, epoch, iteration, lr)
        if previous is not None:
            value = previous.asscalar()
            check_finite(value, epoch, iteration - 1, trainer, args)
            if math.isfinite(value):
                progress_state['loss_sum'] += value
                progress_state['loss_count'] += 1
                window_loss += value
                window_count += 1
        previous = loss
        now = time.time()
        durations.append(now - tick)
        tick = now
        done = iteration + 1
        if done % args.disp_batches == 0:
            ips = args.disp_batches * global_batch / (now - window_start)
            window_start = now
            dllogger.log((epoch, done), {'train.loss': window_loss / max(window_count, 1), 'train.ips': ips,
                                         'train.lr': lr})
            window_loss, window_count = 0.0, 0
        progress.update(done, global_batch / max(np.mean(durations[-20:]), 1e-9))
        if stop_agreed(stop, trainer.world, done, args.disp_batches) and done < iterations:
            stopped = True
            break
    if previous is not None:
        value = previous.asscalar()
        check_finite(value, epoch, iteration, trainer, args)
        if math.isfinite(value):
            progress_state['loss_sum'] += value
            progress_state['loss_count'] += 1
    progress.close()
    return iteration + 1, durations, stopped


def stop_agreed(stop, world, done, every):
    """Whether all workers stop now: checked every iteration alone, every `every` iterations with several
    workers (a collective per iteration would cost more than the latency it saves)."""
    if world.size == 1:
        return stop.requested
    if done % every:
        return False
    return world.allreduce_sum([1.0 if stop.requested else 0.0])[0] > 0


def validate(args, net, loader, world, passes_label=''):
    """One pass over the validation data: top-1, top-5 and loss summed over all workers, each image counted
    once (padding removed); per-batch latencies in seconds (each batch synchronised)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    contexts = args.contexts
    totals = np.zeros(4)  # correct top-1, correct top-5, loss sum, images
    durations = []
    iterations = args.benchmark_iters or loader.num_batches
    tick = time.time()
    for batch in batches(loader, 0, 0, iterations):
        images = gluon.utils.split_and_load(batch.data[0], contexts, even_split=True)
        labels = gluon.utils.split_and_load(batch.label[0], contexts, even_split=True)
        outputs = [net(x) for x in images]
        valid = batch.data[0].shape[0] - batch.pad
        if not args.no_metrics:
            totals += batch_metrics(outputs, labels, valid, loss_fn)
        else:
            outputs[-1].wait_to_read()
            totals[3] += valid
        now = time.time()
        durations.append(now - tick)
        tick = now
    totals = world.allreduce_sum(totals)
    seen = max(totals[3], 1)
    metrics = {}
    if not args.no_metrics:
        metrics = {'val.loss': totals[2] / seen, 'val.accuracy': totals[0] / seen,
                   'val.top_k_accuracy_5': totals[1] / seen}
    steady = steady_durations(durations)
    batch_seconds = float(np.mean(steady)) if steady else 0.0
    metrics['val.ips'] = loader.batch_size * world.size / batch_seconds if batch_seconds else 0.0
    metrics['val.latency_avg'] = batch_seconds
    log.info('Validation%s: %d images%s', passes_label, int(totals[3]),
             '' if args.no_metrics else f', top-1 {metrics["val.accuracy"]:.4f} top-5 '
                                        f'{metrics["val.top_k_accuracy_5"]:.4f}')
    return metrics, steady


def batch_metrics(outputs, labels, valid, loss_fn):
    """[top-1 correct, top-5 correct, loss sum, count] over the first `valid` samples of the split batch."""
    totals = np.zeros(4)
    offset = 0
    for output, label in zip(outputs, labels):
        keep = min(max(valid - offset, 0), output.shape[0])
        offset += output.shape[0]
        if keep == 0:
            continue
        output, label = output[:keep].astype('float32'), label[:keep]
        k = min(5, output.shape[1])
        top = mx.nd.topk(output, k=k, axis=1, ret_typ='indices').asnumpy()
        truth = label.asnumpy().astype(np.int64)[:, None]
        totals += [float((top[:, :1] == truth).sum()), float((top == truth).any(axis=1).sum()),
                   float(loss_fn(output, label).sum().asscalar()), keep]
    return totals


def latency_percentiles(durations):
    if not durations:
        return {}
    return {f'val.latency_{p}': float(np.percentile(durations, p)) for p in (50, 90, 95, 99, 100)}


# ----------------------------------------------------------------------------------------------------------
# Modes


def test_io(args, world, get_loaders, dllogger):
    """Read the data alone for --num-epochs epochs (default 1) and report images/s."""
    train_loader, val_loader = get_loaders(args, world.rank, world.size, train=args.test_io_mode == 'train',
                                           val=args.test_io_mode == 'val')
    loader = train_loader if args.test_io_mode == 'train' else val_loader
    if loader is None:
        raise RecipeError(f'--test-io-mode {args.test_io_mode} needs --data-{args.test_io_mode}')
    iterations = args.benchmark_iters or loader.num_batches
    rates = []
    for epoch in range(args.num_epochs):
        durations = []
        tick = time.time()
        for i, batch in enumerate(batches(loader, epoch, 0, iterations), 1):
            batch.data[0].wait_to_read()
            now = time.time()
            durations.append(now - tick)
            tick = now
            if i % args.disp_batches == 0:
                log.info('Batch [%d] Speed: %.1f samples/sec', i,
                         loader.batch_size * world.size / np.mean(durations[-args.disp_batches:]))
        rate = loader.batch_size * world.size / float(np.mean(steady_durations(durations)))
        rates.append(rate)
        dllogger.log((epoch,), {f'{args.test_io_mode}.ips': rate})
    dllogger.log((), {f'{args.test_io_mode}.ips': float(np.mean(rates))})


def evaluate(args, net, world, get_loaders, dllogger):
    """--mode val: one validation pass (or --num-epochs passes) of `net`, made ready by
    inference.inference_network (trained weights, INT8 if asked)."""
    _, val_loader = get_loaders(args, world.rank, world.size, train=False, val=True)
    if val_loader is None:
        raise RecipeError('--mode val needs validation data: pass --data-val (and --data-val-idx)')
    all_durations, history = [], []
    for epoch in range(args.num_epochs):
        metrics, durations = validate(args, net, val_loader, world, f' pass {epoch}')
        metrics.update(latency_percentiles(durations))
        dllogger.log((epoch,), metrics)
        all_durations += durations
        history.append(metrics)
    summary = {k: float(np.mean([m[k] for m in history])) for k in history[0]}
    for key in ('val.accuracy', 'val.top_k_accuracy_5'):
        if key in summary:
            summary[key] = max(m[key] for m in history)
    summary.update(latency_percentiles(all_durations))
    return summary, history


IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp')


def prediction_inputs(path):
    """The image files --data-pred names: one file, or every image file of a folder (sorted)."""
    if path is None:
        raise RecipeError('--mode pred needs --data-pred IMAGE_OR_FOLDER')
    if os.path.isdir(path):
        files = sorted(os.path.join(path, name) for name in os.listdir(path)
                       if name.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise RecipeError(f'--data-pred {path}: no JPEG or PNG images in that folder')
        return files
    if not os.path.exists(path):
        raise RecipeError(f'--data-pred {path}: no such file or folder')
    return [path]


def class_names(args):
    """Names for the output classes: --classes, else classes.json beside the training or validation data,
    else the ImageNet names for a 1000-class model, else "class N"."""
    candidates = [args.classes] if args.classes else [
        os.path.join(os.path.dirname(p), 'classes.json') for p in (args.data_train, args.data_val) if p]
    for path in candidates:
        if os.path.exists(path):
            with open(path) as f:
                entries = json.load(f)['classes']
            names = {e['index']: e.get('name') or e['folder'] for e in entries}
            return [names.get(i, f'class {i}') for i in range(args.num_classes)]
    if args.classes:
        raise RecipeError(f'--classes {args.classes}: no such file')
    if args.num_classes == 1000:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'imagenet_classes.txt')) as f:
            return [line.rstrip('\n').split(' ', 1)[1] for line in f]
    return [f'class {i}' for i in range(args.num_classes)]


def predict(args, net):
    """--mode pred: the top --topk classes of each image, with probabilities, printed and optionally saved
    as JSON. An unreadable image is reported and the others are still classified. `net` comes from
    inference.inference_network (trained weights, INT8 if asked)."""
    import data
    names = class_names(args)
    results = []
    for path in prediction_inputs(args.data_pred):
        try:
            image = data.load_image(path, args).as_in_context(args.contexts[0])
        except RecipeError as e:
            log.error('%s', e)
            results.append({'image': path, 'error': str(e)})
            continue
        probabilities = mx.nd.softmax(net(image).astype('float32')).asnumpy()[0]
        top = np.argsort(-probabilities)[:args.topk]
        print(f'{path}:')
        for rank, index in enumerate(top, 1):
            print(f'{rank:>3}. {probabilities[index] * 100:6.2f}% -> {names[index]}')
        results.append({'image': path, 'top': [{'class': int(i), 'name': names[i],
                                                 'probability': float(probabilities[i])} for i in top]})
    if args.pred_output:
        logs.write_json(args.pred_output, {'checkpoint': find_weights(args), 'predictions': results})
    if all('error' in r for r in results):
        raise RecipeError('no image could be read')
    return results


def start_state(args, net):
    """Where training starts: (meta of a resumed state or None, trainer state bytes or None)."""
    path = args.load
    if path is None and os.path.exists(last_state_path(args)):
        path = last_state_path(args)
        log.info('Resuming from %s', path)
    if path is None:
        return None, None
    if not os.path.exists(path):
        raise RecipeError(f'--load {path}: no such file')
    if path.endswith('.state'):
        params, trainer_states, meta = read_state(path)
        load_params_into(net, params, args.contexts, path)
        log.info('Loaded %s: epoch %d, iteration %d', path, meta['epoch'], meta['iteration'])
        return meta, trainer_states
    load_weights(net, path, args.contexts)
    return None, None


def train(args, net, world, get_loaders, dllogger, stop):
    """--mode train / train_val: the epoch loop with validation and checkpoints."""
    meta, trainer_states = start_state(args, net)
    trainer = Trainer(args, net, world)
    if meta is not None:
        if meta.get('seed') is not None and meta['seed'] != args.seed:
            log.info('Using the seed of the resumed run, %d', meta['seed'])
            args.seed = meta['seed']
        with tempfile.TemporaryDirectory() as tmpdir:
            states_file = os.path.join(tmpdir, 'trainer.states')
            with open(states_file, 'wb') as f:
                f.write(trainer_states)
            trainer.trainer.load_states(states_file)
        if trainer.loss_scale is not None and meta.get('loss_scale'):
            trainer.loss_scale.scale = meta['loss_scale']
    if world.horovod is not None:
        world.horovod.broadcast_parameters(net.collect_params(), root_rank=0)
    meta = meta or {'epoch': args.begin_epoch or 0, 'iteration': 0, 'best_accuracy': None, 'history': [],
                    'loss_sum': 0.0, 'loss_count': 0}
    train_loader, val_loader = get_loaders(args, world.rank, world.size, train=True,
                                           val=args.mode == 'train_val')
    if args.mode == 'train_val' and val_loader is None:
        raise RecipeError('--mode train_val needs validation data (--data-val); use --mode train to skip it')
    last_epoch = args.num_epochs if args.run_epochs < 0 else min(args.num_epochs,
                                                                 meta['epoch'] + args.run_epochs)
    for epoch in range(meta['epoch'], last_epoch):
        start_batch = meta['iteration'] if epoch == meta['epoch'] else 0
        if start_batch == 0:
            meta['loss_sum'], meta['loss_count'] = 0.0, 0
        log.info('Starting epoch %d', epoch)
        next_batch, durations, stopped = train_epoch(args, trainer, train_loader, epoch, start_batch, meta,
                                                     dllogger, stop)
        if stopped:
            meta.update(epoch=epoch, iteration=next_batch)
            write_state(args, net, trainer, meta, world)
            log.info('Stopped at epoch %d iteration %d; the next run resumes from %s', epoch, next_batch,
                     last_state_path(args))
            return meta
        loss_sum, loss_count = world.allreduce_sum([meta['loss_sum'], meta['loss_count']])
        steady = steady_durations(durations)
        metrics = {'train.loss': loss_sum / max(loss_count, 1),
                   'train.ips': train_loader.batch_size * world.size / float(np.mean(steady))}
        if val_loader is not None:
            log.info('Validating epoch %d', epoch)
            val_metrics, _ = validate(args, net, val_loader, world)
            metrics.update(val_metrics)
        dllogger.log((epoch,), metrics)
        meta['history'].append(dict(metrics, epoch=epoch))
        meta.update(epoch=epoch + 1, iteration=0, loss_sum=0.0, loss_count=0)
        save_epoch_checkpoints(args, net, epoch, metrics, meta, world)
        write_state(args, net, trainer, meta, world)
        write_report(args, meta, world)
        if stop_agreed(stop, world, 0, 1):
            log.info('Stopped after epoch %d; the next run resumes from %s', epoch, last_state_path(args))
            break
    return meta


def save_epoch_checkpoints(args, net, epoch, metrics, meta, world):
    """<prefix>_NNNN.params every --save-frequency epochs and <prefix>_best.params on a new best top-1."""
    if world.rank != 0 or args.save_frequency == 0:
        return
    if args.save_frequency > 0 and (epoch + 1) % args.save_frequency == 0:
        path = workspace_path(args, f'{args.model_prefix}_{epoch:04d}.params')
        save_params(net, path)
        log.info('[Epoch %d] Saved %s', epoch, path)
    accuracy = metrics.get('val.accuracy')
    if accuracy is not None and (meta['best_accuracy'] is None or accuracy > meta['best_accuracy']):
        meta['best_accuracy'] = accuracy
        path = workspace_path(args, f'{args.model_prefix}_best.params')
        save_params(net, path)
        log.info('[Epoch %d] Saved %s with accuracy %.4f', epoch, path, accuracy)


def write_state(args, net, trainer, meta, world):
    if world.rank != 0:
        return
    meta = dict(meta, seed=args.seed,
                loss_scale=trainer.loss_scale.scale if trainer.loss_scale is not None else None)
    save_state(last_state_path(args), net, trainer.trainer, meta)


def write_report(args, meta, world, summary=None):
    """report.json: the resolved configuration, versions, hardware, per-epoch metrics and duration."""
    if world.rank != 0:
        return
    config = {k: v for k, v in vars(args).items() if k not in ('contexts',)}
    report = {'model': args.arch, 'mode': args.mode, 'workers': world.size,
              'devices': [str(c) for c in args.contexts], 'cmd': sys.argv, 'config': config,
              'versions': logs.library_versions(), 'hardware': logs.hardware(),
              'epochs': meta.get('history', []) if meta else [],
              'total_duration': time.time() - args.start_time, 'peak_memory_mb': peak_memory_mb()}
    if summary is not None:
        report['summary'] = summary
    logs.write_json(workspace_path(args, 'report.json'), report)


def peak_memory_mb():
    """Peak resident memory of this process (host memory; GPU memory is reported by nvidia-smi)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def training_summary(history):
    """Summary record: lowest loss, mean throughput, best accuracies over the epochs."""
    summary = {}
    for key in sorted({k for m in history for k in m if k != 'epoch'}):
        values = [m[key] for m in history if key in m]
        if key in ('train.loss', 'val.loss'):
            summary[key] = min(values)
        elif key in ('val.accuracy', 'val.top_k_accuracy_5'):
            summary[key] = max(values)
        else:
            summary[key] = float(np.mean(values))
    return summary


def fit(args, net, world, get_loaders):
    """Run the mode in args.mode on `net` (built by models.get_model) with data from `get_loaders`."""
    args.start_time = time.time()
    if args.num_epochs is None:   # the schedule's 90 epochs; one pass for val and the loader test
        args.num_epochs = 1 if args.mode in ('val', 'pred', 'export') or args.test_io else 90
    os.makedirs(args.workspace, exist_ok=True)
    dllogger_path = os.path.join(args.logdir or args.workspace, args.dllogger_log)
    dllogger = logs.DLLogger(dllogger_path if world.rank == 0 else None, echo=world.rank == 0)
    config = {k: v for k, v in vars(args).items() if k not in ('contexts', 'start_time')}
    dllogger.log('PARAMETER', config)
    try:
        resolve_seed(args, world)
        net.initialize(ctx=args.contexts)
        net.hybridize(static_alloc=True, static_shape=True)
        if args.test_io:
            test_io(args, world, get_loaders, dllogger)
            return
        if args.mode == 'export':
            write_report(args, None, world, summary=inference.export(args, net, world, get_loaders))
            return
        if args.mode in ('val', 'pred'):
            net = inference.inference_network(args, net, world, get_loaders)
        if args.mode == 'pred':
            predict(args, net)
            return
        if args.mode == 'val':
            summary, history = evaluate(args, net, world, get_loaders, dllogger)
            write_report(args, {'history': history}, world, summary)
        else:
            meta = train(args, net, world, get_loaders, dllogger, StopRequest())
            summary = training_summary(meta['history'])
            write_report(args, meta, world, summary)
        mx.nd.waitall()
        dllogger.log((), summary)
        log.info('Done in %.1f s; peak memory %.0f MB. Outputs in %s', time.time() - args.start_time,
                 peak_memory_mb(), os.path.abspath(args.workspace))
    finally:
        dllogger.close()
