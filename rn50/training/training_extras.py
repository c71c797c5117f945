"""The training features users of timm and torchvision expect, as hooks fit.py calls at fixed points:

* --model-ema, --model-ema-decay, --model-ema-steps, --model-ema-warmup, --model-ema-adjust: a float32 moving
  average of the weights (ema.py), validated every epoch
  beside the trained weights (`val.ema.*`), saved as `<prefix>_ema_best.params` on its own best top-1 and
  kept in `<prefix>_last.state`; an average not updated yet is neither validated nor saved (the log says so),
  and a run too short for --model-ema-steps is warned at its first step.
* --cutmix, --mixup-switch-prob, --mixup-mode: losses.py draws and pastes the boxes (per image, pair or batch).
* --bce-loss, --bce-target-thresh: TrainingStep's loss and losses.bce_targets.
* --grad-accum-steps K: Accumulation (gradients summed over K batches, one optimizer step).
* --keep-checkpoints N: Workspace.prune_epoch_params (fit.save_epoch_checkpoints).
* --target-accuracy A: the run stops after the first validation whose top-1 reaches A (target_reached).
* --tensorboard [DIR]: tensorboard_log.py.

Every draw is a function of the seed and the position in training, and every piece of state is in the
.state file, so a resumed run continues as an uninterrupted one would.
"""
import functools
import logging
import os
import time

from rn50.checkpoints import checkpoint
from rn50 import flags
from rn50.errors import RecipeError
from rn50.inference import inference
from rn50.training import ema
from rn50.training import losses

log = logging.getLogger(__name__)

# Of the validation metrics, those computed again with the weight average (the speed ones would repeat).
EMA_METRICS = ('val.loss', 'val.accuracy', 'val.top_k_accuracy_5')


def add_args(group):
    """The flags, in fit.py's Training group."""
    group.add_argument('--cutmix', type=flags.real(minimum=0), default=0,
                       help='alpha of CutMix (0: off): a box of another image of the batch pasted in, the targets '
                            'mixed by its area; with --mixup too, one of them per batch')
    group.add_argument('--mixup-switch-prob', type=flags.real(minimum=0, maximum=1), default=0.5,
                       help='with both --mixup and --cutmix, the probability that a draw (--mixup-mode) is CutMix')
    group.add_argument('--mixup-mode', default='elem', choices=losses.MIXUP_MODES,
                       help='what shares one draw of --mixup and --cutmix (mixup or CutMix, its lambda or box), as '
                            'timm\'s --mixup-mode: elem (default), each image (the original recipe\'s mixup); pair, '
                            'images i and B-1-i, each mixed with the other; batch, each device\'s batch (timm\'s and '
                            'torchvision\'s recipes)')
    group.add_argument('--bce-loss', action='store_true',
                       help='binary cross-entropy on each class (timm\'s): sigmoid of each logit against the '
                            'targets of --label-smoothing, mixup and CutMix, averaged over the classes; validation '
                            'still reports the softmax cross-entropy')
    group.add_argument('--bce-target-thresh', type=flags.real(minimum=0, maximum=1), default=None,
                       help='--bce-loss: targets above this become 1, the others 0 (timm\'s; ResNet strikes back '
                            'uses 0.2)')
    group.add_argument('--grad-accum-steps', type=flags.integer(minimum=1), default=1,
                       help='one optimizer step every K batches (the effective batch is K times --batch-size; '
                            'the runner scales -l by it)')
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
    group.add_argument('--keep-checkpoints', type=flags.integer(minimum=0), default=0,
                       help='keep only the newest N <prefix>_NNNN.params (0: all)')
    group.add_argument('--target-accuracy', type=flags.real(minimum=0, maximum=1, exclusive=True), default=None,
                       help='stop after the first validation whose top-1 reaches this (e.g. 0.759)')
    group.add_argument('--tensorboard', nargs='?', const='tensorboard', default=None, metavar='DIR',
                       help='write TensorBoard event files to DIR (relative: in the workspace; default '
                            'tensorboard)')


def check(args):
    """Flag combinations that cannot work, before any training."""
    if args.target_accuracy is not None and args.mode != 'train_val':
        raise RecipeError('--target-accuracy needs a validation every epoch: use --mode train_val')
    if args.bce_target_thresh is not None and not args.bce_loss:
        raise RecipeError('--bce-target-thresh sets the targets of --bce-loss: add --bce-loss')
    if (args.eval_period, args.eval_offset) != (1, 0) and args.mode != 'train_val':
        raise RecipeError('--eval-period and --eval-offset say when train_val validates: use --mode train_val')


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


# ----------------------------------------------------------------------------------------------------------
# The weight average


def start_average(args, net, world, state):
    """The WeightAverage of --model-ema (None without it): the resumed state's when it holds one (with this
    worker's own batchnorm statistics when the state was written by as many workers), else the current
    weights'."""
    if not args.model_ema:
        return None
    adjusted = ema_decay_adjusted(args) if args.model_ema_adjust else None
    if adjusted is not None:
        log.info('--model-ema-adjust: each update of the weight average (every %d steps) decays by %.6g; the '
                 'first update, and each after one within the %g warm-up epochs, copies the weights (torchvision\'s)',
                 args.model_ema_steps, adjusted, args.warmup_epochs)
    average = ema.WeightAverage(net, args.model_ema_decay, world.devices.contexts[0], every=args.model_ema_steps,
                                warmup=args.model_ema_warmup, decay_per_update=adjusted,
                                copy_epochs=args.warmup_epochs if args.model_ema_adjust else None,
                                on_first_step=functools.partial(check_average_schedule, args))
    if state is not None and not average.restore(state.extra, world.rank):
        log.warning('The resumed state holds no weight average: --model-ema starts from the current weights')
    elif state is not None and ema.UPDATES_NAME not in state.extra:
        log.info('The resumed state does not say how often its weight average was updated (written by an earlier '
                 'version): it is taken as updated')
    return average


# A weight average still holding more than this share of its starting weights at the end of the run is warned.
STARTING_SHARE_WARNED = 0.1


def check_average_schedule(args, step, steps_per_epoch):
    """At the run's first optimizer step, when the length of an epoch is known: a warning when the whole run
    (--num-epochs epochs of `steps_per_epoch` optimizer steps) is too short for the average's schedule: it ends
    before the first update (--model-ema-steps), or, with --model-ema-adjust, before the first update that
    averages instead of copying the weights (torchvision's warm-up), or, with a constant decay, so soon that the
    average is still mostly its starting weights. `step`, this process's first optimizer step, does not matter:
    the check is of the whole run, so a resumed run says it again."""
    every, total = args.model_ema_steps, steps_per_epoch * args.num_epochs
    run = f'{total} optimizer steps in all ({args.num_epochs} epochs of {steps_per_epoch})'
    if total < every:
        log.warning('--model-ema-steps %d: the weight average is first updated after optimizer step %d, and this run '
                    'has %s: it would stay the starting weights, so it is never validated nor saved. Give '
                    '--model-ema-steps %d or less (or train longer)', every, every, run, total)
    elif args.model_ema_adjust and ema.copies_weights(total - total % every, every, steps_per_epoch,
                                                      args.warmup_epochs):
        log.warning('--model-ema-adjust: every update of the weight average (every %d steps) comes within or right '
                    'after the %g warm-up epochs, and so copies the weights (torchvision\'s rule), over the %s: '
                    'val.ema.* will be the weights\' own. Lower --model-ema-steps or --warmup-epochs, or train longer',
                    every, args.warmup_epochs, run)
    elif not args.model_ema_adjust and not args.model_ema_warmup:
        # Each update keeps decay**every of the average: after the run's updates, the starting weights (the
        # initialisation, or the weights it resumed) still make up decay**(steps averaged) of it.
        start = args.model_ema_decay ** (total - total % every)
        if start > STARTING_SHARE_WARNED:
            span = f'about {round(1 / (1 - args.model_ema_decay))}' if args.model_ema_decay < 1 else 'endless'
            log.warning('--model-ema-decay %g spans %s optimizer steps and this run has %s: at its end the weight '
                        'average is still %.0f%% its starting weights, and val.ema.* says little. Give '
                        '--model-ema-warmup (timm\'s warm-up of the decay), or --model-ema-decay %.4g or lower',
                        args.model_ema_decay, span, run, 100 * start, STARTING_SHARE_WARNED ** (1 / total))


def ema_decay_adjusted(args):
    """torchvision's adjustment (references/classification/train.py, after pycls): the decay of one update,
    alpha = (1 - decay) x global batch x update period / epochs, capped at 1, independent of those settings."""
    alpha = (1 - args.model_ema_decay) * args.batch_size * args.grad_accum_steps * args.model_ema_steps / \
        args.num_epochs
    return 1 - min(1.0, alpha)


def average_state(average, net, world):
    """The arrays of the weight average for the .state file (None without --model-ema), with every worker's
    averaged batchnorm statistics: a collective, every worker calls it."""
    if average is None:
        return None
    with average.swapped_in():
        statistics = checkpoint.worker_statistics(net, world)
    return average.state_arrays(statistics)


def validate_average(args, net, average, val_loader, world, meta, epoch, saver, writer=None):
    """`val.ema.*` metrics of the weight average, and `<prefix>_ema_best.params` on its best top-1 (by `saver`,
    the run's checkpoints.saver.Saver; written by `writer`, checkpoint.BackgroundWriter, from copies made while the
    average is swapped in)."""
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
        metrics, _ = inference.validate(args, net, val_loader, world, passes_label=' of the weight average')
        saver.save_best_average(net, epoch, metrics.get('val.accuracy'), meta, writer)
    return {'val.ema.' + key[len('val.'):]: metrics[key] for key in EMA_METRICS if key in metrics}


# ----------------------------------------------------------------------------------------------------------
# Wall time and the target accuracy


class WallClock:
    """Training wall time over every run of a workspace: the time the resumed state had, plus this process's
    since it started (`start`, time.time()); what a kill -9 interrupts after the last state is not counted."""

    def __init__(self, meta, start):
        self.before = meta.get('wall_seconds', 0.0)
        self.start = start

    def record(self, meta):
        """Store the time so far in `meta` (and so in the state) and in the newest history entry."""
        meta['wall_seconds'] = self.before + time.time() - self.start
        if meta['history']:
            meta['history'][-1].setdefault('wall_seconds', meta['wall_seconds'])


def target_epoch(history, target):
    """The first history entry whose top-1 reaches `target`, or None."""
    if target is None:
        return None
    return next((m for m in history if m.get('val.accuracy') is not None and m['val.accuracy'] >= target), None)


def target_reached(args, meta):
    """Whether the run stops here (--target-accuracy reached by this epoch or an earlier one); logs it once."""
    reached = target_epoch(meta['history'], args.target_accuracy)
    if reached is not None and reached is meta['history'][-1]:
        log.info('Target accuracy %.4f reached at epoch %d (top-1 %.4f) after %.1f s: stopping', args.target_accuracy,
                 reached['epoch'], reached['val.accuracy'], reached.get('wall_seconds', float('nan')))
    return reached is not None


def target_summary(history, target):
    """The summary's target fields: the epoch and wall time at which `target` was reached (None: never)."""
    if target is None:
        return {}
    reached = target_epoch(history, target) or {}
    return {'target_accuracy': target, 'target_accuracy.epoch': reached.get('epoch'),
            'target_accuracy.wall_seconds': reached.get('wall_seconds')}


def note_inherited_epochs(history):
    """At the end of a run continued from another workspace's state (fit.resume marks the epochs it inherited
    `inherited_from`): a log line that its summary (fit.training_summary) is of this workspace's epochs."""
    inherited = [m for m in history if 'inherited_from' in m]
    if inherited:
        log.info('The summary is of the epochs trained in this workspace, as its model_best.params: epochs %d-%d '
                 'were trained in %s', inherited[0]['epoch'], inherited[-1]['epoch'], inherited[-1]['inherited_from'])
