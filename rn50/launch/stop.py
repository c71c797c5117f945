"""A graceful stop, the worker's end: the signals that ask a training run to stop, turned into a flag the epoch
loop reads at each iteration boundary.

    stop = StopRequest()      # train.py, for --mode train and train_val: installs the handlers
    ...
    stop.announce()           # fit.py, at each iteration boundary: logs the signal once
    if stop.requested: ...    # fit.py: the workers agree, rank 0 writes the last state, the run returns

The runner's end of the same stop is supervisor.py (it turns a signal to the runner into SIGTERM to the local
workers). This is a module of its own, not part of supervisor.py, because the two run in different processes
and share no code: supervisor.py runs in the runner and imports no project module, this runs in every
training worker (and in a train.py started without the runner, where the user's signal arrives directly).
"""
import logging
import signal

log = logging.getLogger(__name__)


class StopRequest:
    """SIGTERM, SIGUSR1 and a first Ctrl-C (SIGINT) set a flag; training stops at the next iteration boundary
    all workers agree on and writes its state. A second Ctrl-C interrupts at once (KeyboardInterrupt)."""

    def __init__(self):
        self.requested = False
        self.received = None      # the signal's name, logged by announce()
        self.announced = False
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        # Flags only. The handler runs between two bytecodes of the main thread, possibly inside the logging
        # module's write to stderr: logging here wrote to that stream again and raised "RuntimeError:
        # reentrant call inside <_io.BufferedWriter name='<stderr>'>" in the training loop (a 2-worker run
        # ended with exit status 1 and no state, about one SIGTERM in 22). announce() logs it.
        if signum == signal.SIGINT and self.requested:
            signal.default_int_handler(signum, frame)
        self.received = signal.Signals(signum).name
        self.requested = True

    def announce(self):
        """Log the signal once, outside the handler (the loop calls this at every iteration boundary)."""
        if self.requested and not self.announced:
            self.announced = True
            log.warning('%s received: stopping at the next iteration boundary%s', self.received,
                        ' (Ctrl-C again to stop at once, without saving)' if self.received == 'SIGINT' else '')
