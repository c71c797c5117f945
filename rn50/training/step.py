"""The training step of one worker: forward and backward on each of its devices, the targets (label
smoothing, mixup, CutMix), loss scaling for float16 and AMP, gradient accumulation (--grad-accum-steps), and
the update through a gluon.Trainer (Horovod's DistributedTrainer with several workers). fit.py's epoch loop
calls

    settings = StepSettings.of(args)                              # the flags as values, once
    step = TrainingStep(net, world, settings, seed, teacher, average)
    # teacher: distill.Teacher for a --teacher; average: ema.start_average's WeightAverage; or None
    loss = step.run(batch, epoch, iteration, lr, before_sync=fetch_next_batch)   # an NDArray, not synchronised
"""
import dataclasses
import inspect
import logging
import math
import os

import mxnet as mx
from mxnet import autograd, gluon

from rn50 import flags
from rn50.checkpoints.optimizer_state import flat_arrays
from rn50.data.contract import device_slices
from rn50.errors import RecipeError
from rn50.optim import factory
from rn50.optim import lamb
from rn50.training import distill
from rn50.training import losses

log = logging.getLogger(__name__)


# --overflow-check's orders (TrainingStep): the update queued before the host reads the overflow flag (UpdateUndo),
# or after it.
OVERFLOW_CHECKS = ('after-update', 'before-update')


def add_args(group):
    """The step's flags, in fit.py's Training group."""
    group.add_argument('--grad-accum-steps', type=flags.integer(minimum=1), default=1,
                       help='one optimizer step every K batches (the effective batch is K times --batch-size; '
                            'the runner scales -l by it)')
    group.add_argument('--overflow-check', choices=OVERFLOW_CHECKS, default=None,
                       help='--dtype float16: when the host reads whether the step overflowed. after-update (the '
                            'default on GPUs) queues the update first and undoes an overflowed one from copies '
                            'kept on the device (about 256 MB per GPU for ResNet-50); before-update (the default '
                            'on the CPU) reads the flag, then queues the update or skips it. The same weights '
                            'either way; docs/gpu-paths.md says which is faster')


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What the flags say of the training step, as values (`of`): the optimizer's keywords (factory.create's,
    factory.optimizer_kwargs), the `targets` (a losses.Targets), the network's `dtype` and --amp, --grad-accum-steps
    (`accumulation`), --backbone-lr-mult, --kv-store (the Gluon kvstore of several devices in one process) and a
    --teacher's distillation (`teacher`, a distill.Distillation, or None), and --overflow-check (None: the device's
    default)."""
    optimizer: dict
    targets: losses.Targets
    dtype: str = 'float32'
    amp: bool = False
    accumulation: int = 1
    backbone_lr_mult: float = 1.0
    kv_store: str = 'device'
    teacher: distill.Distillation = None
    overflow_check: str = None

    # The flags a resumed run must keep as its state recorded them (fit.RESUMED_SETTINGS): the optimizer (--wd and
    # --mom aside: a resume takes the command's), AMP, the accumulation and the targets; the dtype is the network's
    # (Network.RESUMED). The kvstore, the backbone's rate multiplier of a fine-tuning, the teacher and the overflow
    # check's order are not recorded.
    RESUMED = ('optimizer', 'lars_eta', 'lars_eps', 'amp', 'grad_accum_steps') + losses.Targets.RESUMED

    @classmethod
    def of(cls, args):
        return cls(optimizer=factory.optimizer_kwargs(args), targets=losses.Targets.of(args), dtype=args.dtype,
                   amp=args.amp, accumulation=args.grad_accum_steps, backbone_lr_mult=args.backbone_lr_mult,
                   kv_store=args.kv_store, teacher=distill.Distillation.of(args), overflow_check=args.overflow_check)


def check_overflow_check(args):
    """RecipeError for --overflow-check where nothing reads it: it orders the float16 step's loss scaling."""
    if args.overflow_check is not None and (args.dtype != 'float16' or args.amp):
        raise RecipeError('--overflow-check orders the loss scaling of --dtype float16 without --amp (AMP\'s '
                          'scaler reads its own flag): leave it out')


def predivision(world, float16):
    """DistributedTrainer's keywords for summing float16 gradients without losing range: each worker's
    gradient is divided by sqrt(workers) before the sum and the sum by sqrt(workers) after it (the split
    NVIDIA's MLPerf code uses), instead of summing first (at 256 workers the loss scale would settle 8 bits
    lower, with more skipped steps) or dividing first (as many bits lost to underflow). Float32 sums as is."""
    if not float16 or world.size == 1:
        return {}
    if 'gradient_predivide_factor' not in inspect.signature(world.comm.horovod.DistributedTrainer).parameters:
        log.warning('This Horovod has no gradient_predivide_factor: float16 gradients are summed over %d workers '
                    'before they are divided (Horovod 0.21 or newer splits the division)', world.size)
        return {}
    return {'gradient_predivide_factor': math.sqrt(world.size)}


# The original runner's variable for the number of grouped gradient all-reduces per step (the runner sets 16 on
# GPUs); Horovod's DistributedTrainer takes it as num_groups (0.21 and newer), which upstream Horovod reads from
# no variable.
NUM_GROUPS = 'MXNET_HOROVOD_NUM_GROUPS'


def grouping(horovod, environ=os.environ):
    """DistributedTrainer's keyword for grouped gradient all-reduces: num_groups from MXNET_HOROVOD_NUM_GROUPS
    where the variable is set and `horovod` (horovod.mxnet) takes it, else none (one all-reduce per gradient,
    which Horovod fuses into its buffer)."""
    text = environ.get(NUM_GROUPS, '').strip()
    if not text.isdigit() or int(text) == 0:
        return {}
    if 'num_groups' not in inspect.signature(horovod.DistributedTrainer).parameters:
        log.warning('%s=%s, but this Horovod\'s DistributedTrainer has no num_groups (Horovod 0.21 or newer): one '
                    'all-reduce per gradient', NUM_GROUPS, text)
        return {}
    return {'num_groups': int(text)}


class UpdateUndo:
    """What an optimizer update writes, kept so that an overflowed float16 step can be put back after its update
    was queued: every device's trainable weights and optimizer state arrays, copied on the device (two
    multi-tensor kernels per 60 arrays of one device and dtype), and the update counts. On GPUs the step then
    reads the overflow flag only once the update is queued, so the device works through the update while the
    host waits for the flag, instead of idling until the host has queued it."""

    def __init__(self, trainer, params):
        self.trainer, self.params = trainer, [p for p in params.values() if p.grad_req != 'null']
        self.arrays, self.copies, self.counts = [], [], None

    def ready(self):
        """Whether the optimizer's state exists (the first update creates it): only then can it be kept."""
        return all(updater.states for updater in self.trainer._updaters)

    def _written(self):
        arrays = [array for param in self.params for array in param.list_data()]
        for updater in self.trainer._updaters:
            for index in sorted(updater.states):
                arrays += flat_arrays(updater.states[index])
        return arrays

    def keep(self):
        """Queue the copies of what the next update writes, and note the update counts (host values)."""
        arrays = self._written()
        if len(arrays) != len(self.arrays) or any(a is not b for a, b in zip(arrays, self.arrays)):
            self.arrays, self.copies = arrays, [mx.nd.zeros(a.shape, a.context, dtype=a.dtype) for a in arrays]
        groups = {}
        for array, copy in zip(self.arrays, self.copies):
            groups.setdefault((array.context, array.dtype), []).append((array, copy))
        for pairs in groups.values():
            for start in range(0, len(pairs), COPIES_PER_CALL):
                chunk = pairs[start:start + COPIES_PER_CALL]
                copies = [copy for _, copy in chunk]
                # MXNet's SGD kernel as a copier: copy = (1 - lr x wd) x copy - lr x rescale x array with lr 1, wd 0
                # and rescale -1 is the array exactly once the copy is zero (reset_arrays).
                mx.nd.reset_arrays(*copies, num_arrays=len(copies))
                mx.nd.multi_sgd_update(*[a for pair in chunk for a in (pair[1], pair[0])], lrs=(1.0,) * len(chunk),
                                       wds=(0.0,) * len(chunk), rescale_grad=-1.0, num_weights=len(chunk),
                                       out=copies)
        optimizer = self.trainer._optimizer
        self.counts = (optimizer.num_update,
                       {device: dict(counts) for device, counts in optimizer._all_index_update_counts.items()})

    def undo(self):
        """Put back what the last update wrote (its step overflowed): the arrays, and the update counts MXNet
        keeps per device (in place: the optimizer points at the dictionary of the device it updates)."""
        for array, copy in zip(self.arrays, self.copies):
            copy.copyto(array)
        optimizer = self.trainer._optimizer
        optimizer.num_update = self.counts[0]
        for device, counts in optimizer._all_index_update_counts.items():
            counts.clear()
            counts.update(self.counts[1].get(device, {}))


# Arrays per call of MXNet's multi-tensor SGD kernel (its limit is 60 inputs of each kind; UpdateUndo.keep).
COPIES_PER_CALL = 60


class TrainingStep:
    """The training step of one worker: forward and backward on each of its devices, loss scaling, and the
    update through `gluon_trainer` (a gluon.Trainer, or Horovod's DistributedTrainer)."""

    def __init__(self, net, world, settings, seed=0, teacher=None, average=None):
        """`world.devices`: where and in which AMP dtype to run; `settings`: a StepSettings; `seed`: the run's, for
        mixup and CutMix draws; `teacher`: --teacher's distill.Teacher, whose loss the step's becomes, or None;
        `average`: --model-ema's ema.WeightAverage (ema.start_average), updated after each optimizer step, or None."""
        self.net, self.world, self.settings, self.seed = net, world, settings, seed
        self.targets = targets = settings.targets
        self.contexts = list(world.devices.contexts)
        self.sparse_labels = targets.sparse
        self.loss = gluon.loss.SigmoidBinaryCrossEntropyLoss() if targets.bce else \
            gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=self.sparse_labels)
        self.loss.hybridize(static_alloc=True, static_shape=True)
        self.params = net.collect_params()
        if settings.backbone_lr_mult != 1:
            for name, param in net._collect_params_with_prefix().items():
                if not name.startswith('output.'):
                    param.lr_mult = settings.backbone_lr_mult
        try:
            optimizer = factory.create(**settings.optimizer)   # --optimizer: factory.py
            horovod = world.comm.horovod
            if horovod is not None:
                self.gluon_trainer = horovod.DistributedTrainer(
                    self.params, optimizer, **grouping(horovod),
                    **predivision(world, settings.dtype == 'float16' or world.devices.amp_dtype == 'float16'))
            else:
                self.gluon_trainer = gluon.Trainer(self.params, optimizer,
                                                   kvstore=settings.kv_store if len(self.contexts) > 1 else None,
                                                   update_on_kvstore=False if len(self.contexts) > 1 else None)
        except (ValueError, KeyError, mx.base.MXNetError) as e:
            raise RecipeError(f'--optimizer {settings.optimizer["name"]}: {e}') from e
        self.amp_scaling = world.devices.amp_dtype == 'float16'
        if self.amp_scaling:
            from mxnet.contrib import amp
            amp.init_trainer(self.gluon_trainer)
        self.loss_scale = losses.DynamicLossScale() if settings.dtype == 'float16' and not settings.amp else None
        # --overflow-check. GPUs: read the overflow flag after the update is queued, undoing an overflowed one
        # (UpdateUndo); on the CPU the host's cores are the device's, and the flag is read before the update, as
        # plain skipping.
        order = settings.overflow_check or ('after-update' if world.devices.kind == 'gpu' else 'before-update')
        self.undo = UpdateUndo(self.gluon_trainer, self.params) \
            if self.loss_scale is not None and order == 'after-update' else None
        self.accumulation = Accumulation(settings.accumulation, self.params)
        self.average, self.teacher = average, teacher

    def inputs_and_targets(self, images, labels, epoch, iteration, part):
        """(images, targets) as the loss wants them: the labels sparse or as smoothed one-hot vectors, and
        with mixup or CutMix (per image, pair or batch: --mixup-mode) the images and the targets blended; with
        --bce-target-thresh, the dense targets made binary after all that."""
        if self.sparse_labels:
            return images, labels
        images, targets = self.blended(images, labels, epoch, iteration, part)
        return images, losses.bce_targets(targets, self.targets.bce_threshold)

    def blended(self, images, labels, epoch, iteration, part):
        """(images, smoothed one-hot targets), mixup and CutMix applied per --mixup-mode (losses.mix_draws)."""
        spec = self.targets
        targets = losses.smoothed_one_hot(labels, spec.num_classes, spec.smoothing)
        if spec.mixup == 0 and spec.cutmix == 0:
            return images, targets
        height, width = images.shape[spec.layout.index('H'):][:2]
        own, boxes = losses.mix_draws(self.seed, epoch, iteration, self.world.rank, part, labels.shape[0],
                                      height, width, spec.mixup, spec.cutmix, spec.switch_prob, spec.mode)
        return losses.mix(images, targets, own, boxes, spec.layout)

    def run(self, batch, epoch, iteration, lr, before_sync=None):
        """One optimisation step; returns the batch's mean loss as an NDArray (not synchronised).
        `before_sync()` runs once all up to the host's wait for the overflow flag is queued (float16, AMP; on
        GPUs the float16 update too, UpdateUndo): the loop fetches the next batch there, so the loader's host work
        (DALI's feed and copy) overlaps the device's instead of leaving it idle. `batch` is not read after that
        call."""
        self.gluon_trainer.set_learning_rate(lr)
        images = device_slices(batch.data[0], self.contexts)
        labels = device_slices(batch.label[0], self.contexts)
        with autograd.record():
            device_losses = []
            for part, (x, y) in enumerate(zip(images, labels)):
                x, target = self.inputs_and_targets(x, y, epoch, iteration, part)
                logits = self.net(x)
                loss = self.loss(logits, target)
                device_losses.append(loss if self.teacher is None else self.teacher.loss(x, logits, loss))
            if self.amp_scaling:
                from mxnet.contrib import amp
                with amp.scale_loss(device_losses, self.gluon_trainer) as scaled:
                    autograd.backward(scaled)
            elif self.loss_scale is not None:
                autograd.backward([loss * self.loss_scale.scale for loss in device_losses])
            else:
                autograd.backward(device_losses)
        if self.accumulation.collecting(iteration):   # --grad-accum-steps: the step comes after the group
            return self.mean_loss(device_losses)
        local_batch = sum(x.shape[0] for x in images) * self.accumulation.pending
        # Trainer.step split around the host's wait; all-reduce first, so every worker skips alike.
        self.gluon_trainer.allreduce_grads()
        if isinstance(self.gluon_trainer._optimizer, lamb.TimmLAMB):
            self.gluon_trainer._optimizer.measure_gradients(self.params, self.contexts[0])
        finite = self.loss_scale.check(self.params.values()) if self.loss_scale is not None else None
        # The scale the gradients were computed with: reading the flag may double it for the next step.
        scaled_batch = local_batch * (self.loss_scale.scale if self.loss_scale is not None else 1)
        if self.undo is not None and self.undo.ready():    # the update queued before the host reads the flag
            self.undo.keep()
            self.gluon_trainer.update(scaled_batch)
            if before_sync is not None:
                before_sync()
            if self.loss_scale.overflowed(finite):
                self.undo.undo()
        else:
            if before_sync is not None:
                before_sync()
            if self.loss_scale is None or not self.loss_scale.overflowed(finite):
                self.gluon_trainer.update(scaled_batch)     # AMP's update reads its own overflow flag
        self.accumulation.after_step()
        if self.average is not None:
            self.average.update(self.accumulation.step_number(epoch, iteration),
                                self.accumulation.steps_per_epoch())
        scale = self.current_loss_scale()
        if scale is not None and scale < losses.LOSS_SCALE_FLOOR:
            raise RecipeError(f'the loss scale fell below {losses.LOSS_SCALE_FLOOR:g} at epoch {epoch} '
                              f'iteration {iteration}: every step overflows, so the training has diverged (a NaN '
                              'loss does that). Lower --lr or add --warmup-epochs, and resume from the last state')
        return self.mean_loss(device_losses)

    def mean_loss(self, device_losses):
        means = [loss.mean().as_in_context(self.contexts[0]) for loss in device_losses]
        return mx.nd.add_n(*means) / len(means)

    def current_loss_scale(self):
        """The loss scale in use (host value, no synchronisation), or None without loss scaling."""
        if self.loss_scale is not None:
            return self.loss_scale.scale
        if self.amp_scaling:
            return self.gluon_trainer._amp_loss_scaler.loss_scale
        return None

    def scaler_state(self):
        """What a resume needs of the loss scaler (ours, or AMP's), or None."""
        if self.loss_scale is not None:
            return self.loss_scale.state()
        if self.amp_scaling:
            scaler = self.gluon_trainer._amp_loss_scaler
            return {'scale': scaler.loss_scale, 'next_scale': scaler._next_loss_scale,
                    'unskipped': scaler._unskipped}
        return None

    def restore_scaler(self, state):
        if state is None:
            return
        if self.loss_scale is not None:
            self.loss_scale.restore(state)
        elif self.amp_scaling:
            scaler = self.gluon_trainer._amp_loss_scaler
            scaler._loss_scale, scaler._next_loss_scale, scaler._unskipped = \
                state['scale'], state['next_scale'], state['unskipped']

    @property
    def skips_bad_steps(self):
        """With loss scaling a non-finite loss is an overflow to skip, not a divergence to stop on."""
        return self.amp_scaling or self.loss_scale is not None


# ----------------------------------------------------------------------------------------------------------
# Gradient accumulation


class Accumulation:
    """--grad-accum-steps K: the batches of an epoch form groups of K (iterations 0..K-1, K..2K-1, ...), the
    gradients of a group are summed (grad_req 'add') and one optimizer step is taken after its last batch,
    normalised by all the group's images; the last group of an epoch whose batch count is not a multiple of K
    is shorter (its step averages over the batches it has). The learning rate of a step is the schedule's at
    its group's first batch, so steps follow the schedule of a K times larger batch. A run stops (signal) only
    after a step, so a resume never needs a half-summed gradient."""

    def __init__(self, steps, params):
        self.steps = steps
        self.params = params      # the network's ParameterDict
        self.pending = 0          # batches summed since the last step
        self.iterations = None    # batches in the current epoch
        if steps > 1:
            for param in params.values():
                if param.grad_req != 'null':
                    param.grad_req = 'add'

    def start_epoch(self, iterations):
        self.iterations = iterations
        self.pending = 0

    def group_start(self, iteration):
        """The first iteration of `iteration`'s group (where its learning rate is read)."""
        return iteration - iteration % self.steps

    def collecting(self, iteration):
        """Count this batch; True while its group has more batches to come (no step yet)."""
        self.pending += 1
        done = iteration + 1
        return done % self.steps != 0 and done != self.iterations

    def after_step(self):
        """The number of batches the step just taken covered; the summed gradients start again from zero."""
        batches, self.pending = self.pending, 0
        if self.steps > 1:
            self.params.zero_grad()    # one reset_arrays call per device, not one operator per array
        return batches

    def steps_per_epoch(self):
        """Optimizer steps in an epoch (the last group may be shorter)."""
        return -(-self.iterations // self.steps)

    def step_number(self, epoch, iteration):
        """The optimizer steps of the run (1, 2, ...) once the step ending `iteration`'s group is taken."""
        return epoch * self.steps_per_epoch() + -(-(iteration + 1) // self.steps)

    def at_step(self, done):
        """Whether `done` batches of the epoch end a group (a run may stop there)."""
        return done % self.steps == 0
