"""What a training run reached, from its history (saver.Progress.history: one dict of metrics per epoch):

    clock = WallClock(progress, world.start_time)     # fit.train; clock.record(progress) at each state
    target_reached(target_accuracy, progress.history) # --target-accuracy reached: the run stops (logged once)
    summary = training_summary(history, target_accuracy)   # report.json's summary: best, lowest, means
    note_inherited_epochs(history)                    # a run continued from another workspace says so

Epochs a run inherited from another workspace's state (Saver.resume marks them `inherited_from`) are counted
apart: the summary, like the workspace's model_best.params, is of the epochs trained here.
"""
import logging
import time

import numpy as np

log = logging.getLogger(__name__)


def training_summary(history, target_accuracy=None):
    """Summary record: lowest loss, mean throughput, best accuracies over the epochs trained in this workspace,
    each with its epoch (`<metric>.epoch`; a run continued from another workspace's state counts the epochs it
    inherited, marked `inherited_from`, in `inherited_epochs` alone), and where --target-accuracy was reached."""
    summary = target_summary(history, target_accuracy)
    inherited = sum('inherited_from' in m for m in history)   # their best weights are in that workspace
    summary.update({'inherited_epochs': inherited} if inherited else {})
    history = [m for m in history if 'inherited_from' not in m]
    evaluated_epochs = [m['epoch'] for m in history if 'val.accuracy' in m]
    if evaluated_epochs and len(evaluated_epochs) < len(history):   # --eval-period: say which epochs count
        summary['val.epochs'] = ','.join(map(str, evaluated_epochs))
    for key in sorted({k for m in history for k in m if k not in ('epoch', 'wall_seconds')}):
        epochs = [(m[key], m.get('epoch')) for m in history if key in m]
        if key in ('train.loss', 'val.loss', 'val.ema.loss'):
            summary[key], summary[f'{key}.epoch'] = min(epochs, key=lambda pair: pair[0])
        elif key in ('val.accuracy', 'val.top_k_accuracy_5', 'val.ema.accuracy', 'val.ema.top_k_accuracy_5'):
            summary[key], summary[f'{key}.epoch'] = max(epochs, key=lambda pair: pair[0])
        else:
            summary[key] = float(np.mean([value for value, _ in epochs]))
    return summary


class WallClock:
    """Training wall time over every run of a workspace: the time the resumed state had, plus this process's
    since it started (`start`, time.time()); what a kill -9 interrupts after the last state is not counted."""

    def __init__(self, progress, start):
        self.before = progress.wall_seconds or 0.0
        self.start = start

    def record(self, progress):
        """Store the time so far in `progress` (a checkpoints.saver.Progress, and so in the state) and in the newest history
        entry."""
        progress.wall_seconds = self.before + time.time() - self.start
        if progress.history:
            progress.history[-1].setdefault('wall_seconds', progress.wall_seconds)


def target_epoch(history, target):
    """The first history entry whose top-1 reaches `target`, or None."""
    if target is None:
        return None
    return next((m for m in history if m.get('val.accuracy') is not None and m['val.accuracy'] >= target), None)


def target_reached(target, history):
    """Whether the run stops here (`target`, --target-accuracy, reached by this epoch or an earlier one of the
    run's `history`); logs it once."""
    reached = target_epoch(history, target)
    if reached is not None and reached is history[-1]:
        log.info('Target accuracy %.4f reached at epoch %d (top-1 %.4f) after %.1f s: stopping', target,
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
    """At the end of a run continued from another workspace's state (Saver.resume marks the epochs it inherited
    `inherited_from`): a log line that its summary (training_summary) is of this workspace's epochs."""
    inherited = [m for m in history if 'inherited_from' in m]
    if inherited:
        log.info('The summary is of the epochs trained in this workspace, as its model_best.params: epochs %d-%d '
                 'were trained in %s', inherited[0]['epoch'], inherited[-1]['epoch'], inherited[-1]['inherited_from'])
