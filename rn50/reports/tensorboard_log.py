"""--tensorboard [DIR]: the DLLogger records of training also as TensorBoard event files (tensorboardX).

    dllogger = tensorboard_log.teed(folder, world, dllogger, iterations, position)   # fit.train, rank 0 only

The returned logger writes every record to the DLLogger as before, and the scalars to DIR (relative: in the
workspace) on the global step, the batches trained since the run began (epoch * iterations + iteration):
`train/loss`, `train/lr`, `train/ips` every --disp-batches, and per epoch `val/accuracy`, `val/top_k_accuracy_5`,
`val/loss` (`val/ema/...` with --model-ema) at the step of the epoch's last batch. Every run opens the
writer with purge_step one past the step it starts from: TensorBoard then drops what the interrupted run wrote
after its last state (it ran on before it was stopped or killed), so every step appears once. Each record is
written and flushed at once, so a kill -9 loses none that the state already covers: the events go through
tensorboardX's synchronous EventsWriter, not its SummaryWriter, which queues them for a thread and whose
flush() writes only what that thread has already taken from the queue (a run killed right after an epoch's
validation once lost that epoch's val/ scalars).
"""
import logging
import os
import time

log = logging.getLogger(__name__)

# What goes to TensorBoard of each kind of record (the speed of validation and latencies stay in DLLogger).
ITERATION_METRICS = ('train.loss', 'train.lr', 'train.ips')
EPOCH_PREFIX = 'val.'
EPOCH_SKIPPED = ('val.ips', 'val.latency')


def add_args(group):
    """The flag, in fit.py's Training group."""
    group.add_argument('--tensorboard', nargs='?', const='tensorboard', default=None, metavar='DIR',
                       help='write TensorBoard event files to DIR (relative: in the workspace; default '
                            'tensorboard)')


def teed(folder, world, dllogger, iterations, position):
    """`dllogger`, or with --tensorboard (`folder`: where its event files go, relative ones in the workspace:
    Workspace.place; None: no --tensorboard) on rank 0 a TeeLogger in front of it, for a run of `iterations`
    batches an epoch that starts after `position` of them (epoch * iterations + iteration)."""
    if folder is None or world.rank != 0:
        return dllogger
    folder = os.path.abspath(folder)
    log.info('--tensorboard: event files in %s (view them with: tensorboard --logdir %s)', folder, folder)
    # Also at position 0: a run killed before its first state may have left events to supersede.
    return TeeLogger(dllogger, EventFile(folder, purge_step=position + 1), iterations)


# What must be imported before Horovod (workers.World's load_first) for --tensorboard: tensorboardX imports PyTorch
# where it is installed, and PyTorch imported after horovod.mxnet crashes the process.
WRITER_MODULE = 'tensorboardX.event_file_writer'


class EventFile:
    """A new TensorBoard event file in `folder` whose scalars are on disk when add_scalars returns; it starts as
    SummaryWriter's does with purge_step: TensorBoard hides the events of earlier files from that step on."""

    def __init__(self, folder, purge_step):
        # tensorboardX is imported only with --tensorboard (before Horovod: WRITER_MODULE).
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import scalar
        self.new_event, self.scalar_summary = Event, scalar
        os.makedirs(folder, exist_ok=True)
        self.events = EventsWriter(os.path.join(folder, 'events'))
        self.events.write_event(Event(step=purge_step, file_version='brain.Event:2'))
        self.events.write_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))
        self.events.flush()

    def add_scalars(self, scalars, step):
        for tag, value in scalars.items():
            self.events.write_event(self.new_event(wall_time=time.time(), step=step,
                                                   summary=self.scalar_summary(tag, value)))
        self.events.flush()


class TeeLogger:
    """A DLLogger that also writes the training scalars to a TensorBoard EventFile."""

    def __init__(self, dllogger, writer, iterations):
        self.dllogger, self.writer, self.iterations = dllogger, writer, iterations

    def __getattr__(self, name):          # appending, close, ...: the DLLogger's
        return getattr(self.dllogger, name)

    def log(self, step, data, note=''):
        self.dllogger.log(step, data, note=note)
        if isinstance(step, str) or len(step) == 0:
            return
        if len(step) == 2:
            global_step = step[0] * self.iterations + step[1]
            scalars = {key: value for key, value in data.items() if key in ITERATION_METRICS}
        else:
            global_step = (step[0] + 1) * self.iterations
            scalars = {key: value for key, value in data.items()
                       if key.startswith(EPOCH_PREFIX) and not key.startswith(EPOCH_SKIPPED)}
        self.writer.add_scalars({key.replace('.', '/'): value for key, value in scalars.items()}, global_step)
