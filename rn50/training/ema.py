"""Exponential moving average of the weights (--model-ema, --model-ema-decay, --model-ema-steps,
--model-ema-warmup, --model-ema-adjust), as timm's ModelEmaV3 and torchvision's ExponentialMovingAverage: its
flags, the average itself, and what fit.py does with it (start or resume it, validate it, save its best, put it
in the state).

    averaging = ema.AverageSettings.of(args)                     # the flags as values; None without --model-ema
    average = ema.start_average(averaging, net, world, state)   # fit.train: resumed from the state, or fresh
    average.update(step, steps_per_epoch)   # the training step, after optimizer step `step` (1, 2, ...): every
                                            # --model-ema-steps, a = d * a + (1 - d) * w
    metrics = ema.validate_average(net, average, val_loader, world, progress, epoch, saver, validation)   # val.ema.*
    arrays = ema.average_state(average, net, world)        # for the .state file (a collective)

    average = ema.WeightAverage(net, decay=0.9999, ctx=world.devices.contexts[0], every=32)   # float32 copies
    with average.swapped_in():                            # the network computes with the average meanwhile
        metrics, _ = evaluation.validate(validation, net, val_loader, world)
        checkpoint.save_params(net, path)                 # a .params file like any other (`--load` reads it)

Every array of the network is averaged, batchnorm running statistics included, in float32 whatever the
network's precision (a float16 network's weights are averaged as float32 values). With several devices in
one process the first device's arrays are averaged (the trained weights are the same on every device; each
device keeps its own batchnorm statistics). With several workers every worker keeps its own average (the
same weights, its own batchnorm statistics) and validates its part of the data with it. The average is
validated every epoch beside the trained weights (`val.ema.*`), saved as `<prefix>_ema_best.params` on its own
best top-1 and kept in `<prefix>_last.state`; an average not updated yet is neither validated nor saved (the log
says so), and a run too short for its schedule is warned at its first step.
"""
import contextlib
import dataclasses
import functools
import logging
import os

import mxnet as mx
import numpy as np

from rn50 import flags
from rn50.checkpoints import checkpoint
from rn50.inference import evaluation

log = logging.getLogger(__name__)

# Names under which the average goes into a .state file (checkpoint.save_state's `extra` arrays).
STATE_PREFIX = 'ema:'

# The name of the update count in a .state file: whether the average has moved yet survives a resume.
UPDATES_NAME = STATE_PREFIX + '#updates'

# Arrays per multi-tensor update call: MXNet's multi_sgd kernels take at most 60 (as its optimizers do).
ARRAYS_PER_CALL = 60

# Of the validation metrics, those computed again with the weight average (the speed ones would repeat).
EMA_METRICS = ('val.loss', 'val.accuracy', 'val.top_k_accuracy_5')

# A weight average still holding more than this share of its starting weights at the end of the run is warned.
STARTING_SHARE_WARNED = 0.1


def add_args(group):
    """The flags, in fit.py's Training group."""
    group.add_argument('--model-ema', action='store_true',
                       help='keep a moving average of the weights, validated every epoch (val.ema.*) and saved '
                            'as <prefix>_ema_best.params')
    group.add_argument('--model-ema-decay', type=flags.real(minimum=0, maximum=1), default=0.9998,
                       help='the average\'s decay per optimizer step: it spans about 1/(1-decay) steps')
    group.add_argument('--model-ema-steps', type=flags.integer(minimum=1), default=1,
                       help='update the average every N optimizer steps (torchvision\'s --model-ema-steps), with '
                            'the decay raised to the power N: the same average for 1/N of the host work')
    group.add_argument('--model-ema-warmup', action='store_true',
                       help='timm\'s warm-up of the decay: min(decay, 1 - (1 + step)^(-2/3)) at optimizer step '
                            'step, so that the early weights fade quickly')
    group.add_argument('--model-ema-adjust', action='store_true',
                       help='torchvision\'s rule instead of the power: each update\'s decay is 1 - (1 - decay) x '
                            'global batch x --model-ema-steps / --num-epochs (at most 1), as its recipe\'s 0.99998 '
                            'means; and as torchvision, the updates during the --warmup-epochs copy the weights')


@dataclasses.dataclass(frozen=True)
class AverageSettings:
    """--model-ema's settings as values (`of`: None without --model-ema): the decay per optimizer step, an update
    every `every` steps (--model-ema-steps), timm's warm-up of the decay (`warmup`), torchvision's adjusted decay
    and copies during the learning-rate warm-up (`adjust`), and what those depend on: the batch (`batch_size`,
    the global one, and `accumulation`, --grad-accum-steps), the run's `num_epochs` and `warmup_epochs`."""
    decay: float = 0.9998
    every: int = 1
    warmup: bool = False
    adjust: bool = False
    batch_size: int = 192
    accumulation: int = 1
    num_epochs: int = 90
    warmup_epochs: float = 5

    @classmethod
    def of(cls, args):
        if not args.model_ema:
            return None
        return cls(decay=args.model_ema_decay, every=args.model_ema_steps, warmup=args.model_ema_warmup,
                   adjust=args.model_ema_adjust, batch_size=args.batch_size, accumulation=args.grad_accum_steps,
                   num_epochs=args.num_epochs, warmup_epochs=args.warmup_epochs)

    def adjusted_decay(self):
        """torchvision's adjustment (references/classification/train.py, after pycls): the decay of one update,
        alpha = (1 - decay) x global batch x update period / epochs, capped at 1, independent of those
        settings."""
        alpha = (1 - self.decay) * self.batch_size * self.accumulation * self.every / self.num_epochs
        return 1 - min(1.0, alpha)


def warmed_up_decay(decay, step):
    """timm's --model-ema-warmup (ModelEmaV3, gamma 1, power 2/3): the decay at optimizer step `step` is
    1 - (1 + step)^(-2/3), capped at `decay`, so the first steps' weights (far from trained) fade quickly:
    0.37 at step 1, 0.99 at step 999, 0.999 at step 31,622."""
    return min(decay, 1 - (1 + step) ** (-2 / 3))


def copies_weights(step, every, steps_per_epoch, copy_epochs):
    """torchvision's warm-up of the average (references/classification/train.py: after each update made during
    the learning-rate warm-up epochs it sets the average's count to 0, and an update at count 0 copies): whether
    the update after optimizer step `step` copies the weights instead of averaging. It does when it is the first
    update, or when the one before it (after step `step - every`) came within the first `copy_epochs` epochs of
    `steps_per_epoch` optimizer steps. A function of the step, so a resume decides alike."""
    previous = step - every
    return previous < 1 or previous <= copy_epochs * steps_per_epoch


def average_step(decay, count):
    """The multi-tensor SGD arguments that make an update of `count` arrays a = d * a + (1 - d) * w."""
    return dict(num_weights=count, lrs=(1.0,) * count, wds=(1 - decay,) * count, rescale_grad=-(1 - decay))


class WeightAverage:
    """A float32 exponential moving average of every array of `net` on the device `ctx`, moved towards the
    weights every `every` optimizer steps with the per-step decay raised to that power (the same horizon as
    updating every step, for 1/every of the host work), or with `decay_per_update` as it is (torchvision's
    adjusted rule, AverageSettings.adjusted_decay); with `warmup`, timm's warm-up of the decay; with `copy_epochs`,
    torchvision's copy of the weights during the learning-rate warm-up (copies_weights). `updates` counts the
    updates over the run (kept in the state): an average with none is still the weights it started from.
    `on_first_step(step, steps_per_epoch)` is called at the first update() call, when the length of an epoch
    is first known (check_average_schedule checks there that the run is long enough for `every`)."""

    def __init__(self, net, decay, ctx, every=1, warmup=False, decay_per_update=None, copy_epochs=None,
                 on_first_step=None):
        self.decay, self.every, self.warmup, self.decay_per_update = decay, every, warmup, decay_per_update
        self.copy_epochs = copy_epochs
        self.on_first_step = on_first_step
        self.updates = 0          # over the run, resumes included
        self.last_step = 0        # the optimizer step of the latest update() call
        self.ctx = ctx
        self.params = net._collect_params_with_prefix()
        self.average = {name: param.data(ctx).astype('float32', copy=True) for name, param in self.params.items()}
        # float16 weights need the mixed-precision kernel, which also writes a float16 copy of the average:
        # scratch arrays for it, so that the network's own weights are never written.
        self.scratch = {name: mx.nd.zeros(param.shape, ctx=ctx, dtype=param.dtype)
                        for name, param in self.params.items() if np.dtype(param.dtype) != np.float32}

    def update_decay(self, step):
        """The decay of the update after optimizer step `step`."""
        if self.decay_per_update is not None:
            return self.decay_per_update
        decay = warmed_up_decay(self.decay, step) if self.warmup else self.decay
        return decay ** self.every

    def update(self, step, steps_per_epoch=None):
        """After optimizer step `step` (1, 2, ... over the run, of `steps_per_epoch` an epoch): every `every`
        steps, a = d * a + (1 - d) * w for every array, in MXNet's multi-tensor SGD kernels (an SGD step of `a`
        with learning rate 1, weight decay 1 - d and the gradient -(1 - d) * w is exactly that): a few operators
        for all 267 arrays of ResNet-50 instead of three per array; or a = w where copies_weights says so."""
        if self.on_first_step is not None:
            self.on_first_step(step, steps_per_epoch)
            self.on_first_step = None
        self.last_step = step
        if step % self.every:
            return
        if self.ctx.device_type == 'cpu':
            # MXNet's oneDNN batchnorm writes the running statistics outside the engine's dependency
            # tracking (apache/mxnet#18610): without waiting, the average read them half-updated (seen as
            # a run and its resumed twin disagreeing). GPUs (cuDNN) are tracked and keep the pipeline.
            mx.nd.waitall()
        if self.copy_epochs is not None and copies_weights(step, self.every, steps_per_epoch, self.copy_epochs):
            self.copy()
        else:
            self.blend(self.update_decay(step))
        self.updates += 1

    def copy(self):
        """a = w for every array (as float32), exactly."""
        for name, param in self.params.items():
            mx.nd.Cast(param.data(self.ctx), dtype='float32', out=self.average[name])

    def blend(self, decay):
        """a = decay * a + (1 - decay) * w for every array, queued on MXNet's engine."""
        names = list(self.params)
        for first in range(0, len(names), ARRAYS_PER_CALL):
            chunk = names[first:first + ARRAYS_PER_CALL]
            single = [n for n in chunk if n not in self.scratch]
            mixed = [n for n in chunk if n in self.scratch]
            if single:
                inputs = [array for n in single for array in (self.average[n], self.params[n].data(self.ctx))]
                mx.nd.multi_sgd_update(*inputs, out=[self.average[n] for n in single],
                                       **average_step(decay, len(single)))
            if mixed:   # the float32 average is the kernel's master weight, updated in place
                inputs = [array for n in mixed for array in
                          (self.scratch[n], self.params[n].data(self.ctx), self.average[n])]
                mx.nd.multi_mp_sgd_update(*inputs, out=[self.scratch[n] for n in mixed],
                                          **average_step(decay, len(mixed)))

    @contextlib.contextmanager
    def swapped_in(self):
        """The network holds the average (in its own dtypes, on all its devices) inside the block; its own
        arrays, per device, come back afterwards, also on an exception."""
        saved = {name: [data.copy() for data in param.list_data()] for name, param in self.params.items()}
        try:
            for name, param in self.params.items():
                param.set_data(self.average[name].astype(param.dtype))
            yield
        finally:
            for name, param in self.params.items():
                for data, kept in zip(param.list_data(), saved[name]):
                    kept.copyto(data)

    def state_arrays(self, worker_statistics=None):
        """The average as {STATE_PREFIX + name: array} for the .state file, with `worker_statistics` ({rank:
        {name: array}} of every worker's averaged batchnorm statistics, several workers) as
        STATE_PREFIX + 'rank<r>:' + name, and the update count as UPDATES_NAME."""
        arrays = {STATE_PREFIX + name: value for name, value in self.average.items()}
        arrays[UPDATES_NAME] = mx.nd.array([self.updates], dtype='float64')
        for rank, statistics in (worker_statistics or {}).items():
            arrays.update({f'{STATE_PREFIX}rank{rank}:{name}': mx.nd.array(value) for name, value in statistics.items()})
        return arrays

    def restore(self, arrays, rank=0):
        """Take the average back from a read .state (checkpoint.State.extra), with worker `rank`'s own
        batchnorm statistics when the state has them; False when it holds no average (a run that did not
        average, or other names), so the average starts from the current weights. A state written before the
        update count was kept is taken as updated (its count is unknown)."""
        own = f'{STATE_PREFIX}rank{rank}:'
        saved = {name[len(STATE_PREFIX):]: value for name, value in arrays.items() if name != UPDATES_NAME and
                 name.startswith(STATE_PREFIX) and not name[len(STATE_PREFIX):].startswith('rank')}
        if set(saved) != set(self.average):
            return False
        count = arrays.get(UPDATES_NAME)
        if isinstance(count, mx.nd.NDArray):
            count = count.asnumpy()
        self.updates = 1 if count is None else int(np.asarray(count).ravel()[0])
        saved.update({name[len(own):]: value for name, value in arrays.items() if name.startswith(own)})
        for name, value in saved.items():
            value = value if isinstance(value, mx.nd.NDArray) else mx.nd.array(value)
            self.average[name] = value.astype('float32').as_in_context(self.ctx)
        return True


# ----------------------------------------------------------------------------------------------------------
# The average in a training run (fit.py)


def start_average(averaging, net, world, state):
    """The WeightAverage of `averaging` (an AverageSettings; None without --model-ema: None): the resumed `state`'s
    when it holds one (with this worker's own batchnorm statistics when the state was written by as many
    workers), else the current weights'."""
    if averaging is None:
        return None
    adjusted = averaging.adjusted_decay() if averaging.adjust else None
    if adjusted is not None:
        log.info('--model-ema-adjust: each update of the weight average (every %d steps) decays by %.6g; the '
                 'first update, and each after one within the %g warm-up epochs, copies the weights (torchvision\'s)',
                 averaging.every, adjusted, averaging.warmup_epochs)
    average = WeightAverage(net, averaging.decay, world.devices.contexts[0], every=averaging.every,
                            warmup=averaging.warmup, decay_per_update=adjusted,
                            copy_epochs=averaging.warmup_epochs if averaging.adjust else None,
                            on_first_step=functools.partial(check_average_schedule, averaging))
    if state is not None and not average.restore(state.extra, world.rank):
        log.warning('The resumed state holds no weight average: --model-ema starts from the current weights')
    elif state is not None and UPDATES_NAME not in state.extra:
        log.info('The resumed state does not say how often its weight average was updated (written by an earlier '
                 'version): it is taken as updated')
    return average


def check_average_schedule(averaging, step, steps_per_epoch):
    """At the run's first optimizer step, when the length of an epoch is known: a warning when the whole run
    (averaging.num_epochs epochs of `steps_per_epoch` optimizer steps) is too short for the average's schedule
    (`averaging`, an AverageSettings): it ends before the first update (--model-ema-steps), or, with --model-ema-adjust,
    before the first update that averages instead of copying the weights (torchvision's warm-up), or, with a
    constant decay, so soon that the average is still mostly its starting weights. `step`, this process's first
    optimizer step, does not matter: the check is of the whole run, so a resumed run says it again."""
    every, total = averaging.every, steps_per_epoch * averaging.num_epochs
    run = f'{total} optimizer steps in all ({averaging.num_epochs} epochs of {steps_per_epoch})'
    if total < every:
        log.warning('--model-ema-steps %d: the weight average is first updated after optimizer step %d, and this run '
                    'has %s: it would stay the starting weights, so it is never validated nor saved. Give '
                    '--model-ema-steps %d or less (or train longer)', every, every, run, total)
    elif averaging.adjust and copies_weights(total - total % every, every, steps_per_epoch, averaging.warmup_epochs):
        log.warning('--model-ema-adjust: every update of the weight average (every %d steps) comes within or right '
                    'after the %g warm-up epochs, and so copies the weights (torchvision\'s rule), over the %s: '
                    'val.ema.* will be the weights\' own. Lower --model-ema-steps or --warmup-epochs, or train longer',
                    every, averaging.warmup_epochs, run)
    elif not averaging.adjust and not averaging.warmup:
        # Each update keeps decay**every of the average: after the run's updates, the starting weights (the
        # initialisation, or the weights it resumed) still make up decay**(steps averaged) of it.
        start = averaging.decay ** (total - total % every)
        if start > STARTING_SHARE_WARNED:
            span = f'about {round(1 / (1 - averaging.decay))}' if averaging.decay < 1 else 'endless'
            log.warning('--model-ema-decay %g spans %s optimizer steps and this run has %s: at its end the weight '
                        'average is still %.0f%% its starting weights, and val.ema.* says little. Give '
                        '--model-ema-warmup (timm\'s warm-up of the decay), or --model-ema-decay %.4g or lower',
                        averaging.decay, span, run, 100 * start, STARTING_SHARE_WARNED ** (1 / total))


def average_state(average, net, world):
    """The arrays of the weight average for the .state file (None without --model-ema), with every worker's
    averaged batchnorm statistics: a collective, every worker calls it."""
    if average is None:
        return None
    with average.swapped_in():
        statistics = checkpoint.worker_statistics(net, world)
    return average.state_arrays(statistics)


def validate_average(net, average, val_loader, world, progress, epoch, saver, validation, writer=None):
    """`val.ema.*` metrics of the weight average (evaluation.validate's, by `validation`), and
    `<prefix>_ema_best.params` on its best top-1 (by `saver`, the run's checkpoints.saver.Saver, which keeps it
    in `progress`, the run's Progress; written by `writer`, checkpoint.BackgroundWriter, from copies made while
    the average is swapped in)."""
    if average is None or val_loader is None:
        return {}
    if not average.updates:   # the same on every worker: all return before the collective below
        log.info('[Epoch %d] The weight average has not been updated yet (first after optimizer step %d, '
                 '--model-ema-steps; %d steps so far): not validated, no %s', epoch, average.every, average.last_step,
                 os.path.basename(saver.workspace.ema_best_params))
        return {}
    # The average's batchnorm statistics, like the network's, are the same on every worker before it is judged.
    world.comm.average_copies([[average.average[name]] for name, p in average.params.items() if p.grad_req == 'null'])
    with average.swapped_in():
        metrics, _ = evaluation.validate(validation, net, val_loader, world, passes_label=' of the weight average')
        saver.save_best_average(net, epoch, metrics.get('val.accuracy'), progress, writer)
    return {'val.ema.' + key[len('val.'):]: metrics[key] for key in EMA_METRICS if key in metrics}
