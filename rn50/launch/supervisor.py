"""Supervising horovodrun for the runner: output relay, signals, exit status, no process left behind.

    supervisor = Supervisor(['horovodrun', '-np', '2', ..., 'python', 'train.py', ...], env, stop_timeout=120,
                            worker_script='/path/to/train.py')
    sys.exit(supervisor.report(supervisor.run()))

`run` starts the command in its own session (so a Ctrl-C in the terminal reaches only the runner; `horovodrun`
through horovodrun.py beside this file, the same launcher without its build check's MXNet import), makes the
runner the subreaper of everything below it, relays horovodrun's output line by line and returns its exit
status. Signals: SIGTERM or SIGUSR1 to the runner (or a first Ctrl-C, as SIGTERM) goes to the local worker
processes only (those running `worker_script`), never to horovodrun, which would kill them 5 s later: they
agree to stop at the next --disp-batches boundary and rank 0 writes the state. A second signal, or
`stop_timeout` seconds without an exit, hands over to horovodrun's own shutdown (SIGTERM; it kills the workers
after 5 s); a third, or HOROVOD_GRACE_S more, kills every process left. Processes orphaned on the way are
collected and reaped.

`report` turns horovodrun's ending into the runner's: the workers' `error:` lines (user errors, exit status
2) are printed once instead of horovodrun's traceback; a worker that failed otherwise (a crash, a signal, an
uncaught exception) is one `error:` line naming it (`worker_failure`), with horovodrun's status.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

# horovodrun as the Supervisor starts it (horovodrun.py says why).
HOROVODRUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'horovodrun.py')
# After a hand-over to horovodrun's own shutdown: its 5 s grace before SIGKILL, plus a margin.
HOROVOD_GRACE_S = 10
# A worker's line as horovodrun relays it ("[1]<stderr>:text"), and a user error inside it.
WORKER_LINE = re.compile(r'^(?P<prefix>[^\[]*\[[0-9]+(?:,[0-9]+)?\]<std(?:out|err)>:)(?P<text>.*)$', re.S)
WORKER_ERROR = re.compile(r'^(?:[\w.-]+: )?error: (?P<message>.*?)\s*$', re.S)
# The end of horovodrun's traceback when a worker fails: the first worker to fail and its exit status.
WORKER_FAILED = re.compile(r'Process name: (?P<rank>\S+)\s+Exit code: (?P<status>-?\d+)')


def _prctl(option, value):
    """Linux prctl(2); False where it does not exist."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _die_with_the_runner():
    """In horovodrun (before exec): SIGTERM when the runner dies, however it dies (even SIGKILL)."""
    _prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


class Supervisor:
    """Runs `command` (horovodrun ...) in its own session and relays its output; SIGTERM/SIGUSR1/SIGINT to
    the runner become a graceful stop of the workers running `worker_script` (see the module docstring)."""

    def __init__(self, command, env, stop_timeout, worker_script, out=sys.stdout, err=sys.stderr):
        self.command, self.env, self.stop_timeout = command, env, stop_timeout
        self.worker_script = worker_script   # what the workers run: they, not horovodrun, get the signals
        self.out, self.err = out, err
        self.errors = []        # the workers' distinct `error:` messages, in order
        self.held = []          # horovodrun's own lines after a worker error or from its traceback on
        self.traceback = False
        self.lock = threading.RLock()
        self.signals = 0
        self.deadline = None
        self.proc = None

    # output ------------------------------------------------------------------------------------------

    def _relay(self, stream, target):
        for raw in iter(stream.readline, b''):
            line = raw.decode('utf-8', errors='replace')
            with self.lock:
                worker = WORKER_LINE.match(line)
                error = WORKER_ERROR.match(worker.group('text')) if worker else None
                if error:
                    if error.group('message') not in self.errors:
                        self.errors.append(error.group('message'))
                    continue
                self.traceback = self.traceback or (not worker and line.startswith('Traceback'))
                if (self.errors or self.traceback) and not worker:
                    self.held.append((target, line))
                    continue
                target.write(line)
                target.flush()
        stream.close()

    # signals -----------------------------------------------------------------------------------------

    def workers(self):
        """The local worker processes under horovodrun (below it: its helpers, a shell, mpirun...)."""
        import psutil
        found = []
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return found
        for process in descendants:
            try:   # `python train.py ...`, not horovodrun, a shell or mpirun with train.py among their arguments
                if process.cmdline()[1:2] == [self.worker_script]:
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def _on_signal(self, signum, frame):
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            forward = signal.SIGTERM if signum == signal.SIGINT else signum
            workers = self.workers()
            for process in workers:
                try:
                    process.send_signal(forward)
                except Exception:   # gone already
                    pass
            self.deadline = time.time() + self.stop_timeout
            if workers:
                self._note(f'{name}: sent {signal.Signals(forward).name} to the {len(workers)} local workers; '
                           'they stop at the next --disp-batches boundary and write the state (again: stop '
                           'at once)')
            else:
                self._note(f'{name}: no local train.py worker yet; stopping horovodrun')
                self._hand_over()
        elif self.signals == 2:
            self._note(f'{name} again: horovodrun stops the workers (SIGKILL after its 5 s grace)')
            self._hand_over()
        else:
            self._note(f'{name} a third time: killing every process')
            self._kill_all()

    def _note(self, text):
        with self.lock:
            self.err.write(f'runner: {text}\n')
            self.err.flush()

    def _hand_over(self):
        """horovodrun's own shutdown: SIGTERM to it; everything is killed HOROVOD_GRACE_S later."""
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.deadline = time.time() + HOROVOD_GRACE_S
        self.signals = max(self.signals, 2)

    def _kill_all(self):
        import psutil
        for process in self._descendants():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.signals = max(self.signals, 3)
        self.deadline = None

    def _descendants(self):
        import psutil
        try:
            return psutil.Process().children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    # the run -----------------------------------------------------------------------------------------

    def run(self):
        """horovodrun's exit status (128 + N if signal N ended it)."""
        _prctl(36, 1)   # PR_SET_CHILD_SUBREAPER: processes orphaned below us become our children
        self.proc = subprocess.Popen(started(self.command), env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_die_with_the_runner)
        relays = [threading.Thread(target=self._relay, args=(self.proc.stdout, self.out), daemon=True),
                  threading.Thread(target=self._relay, args=(self.proc.stderr, self.err), daemon=True)]
        for thread in relays:
            thread.start()
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
        try:
            while self.proc.poll() is None:
                time.sleep(0.1)
                if self.deadline is not None and time.time() > self.deadline:
                    if self.signals < 2:
                        self._note(f'the workers did not stop within --stop-timeout {self.stop_timeout:g} s')
                        self._hand_over()
                    else:
                        self._note('horovodrun did not stop: killing every process')
                        self._kill_all()
            for thread in relays:
                thread.join(timeout=10)
            self._collect_leftovers()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def _collect_leftovers(self):
        """Processes left below the runner once horovodrun is gone: a little time to exit, then SIGTERM,
        then SIGKILL; zombies reaped."""
        import psutil
        for grace, action in ((3, None), (3, 'terminate'), (3, 'kill')):
            alive = [p for p in self._descendants() if p.pid != self.proc.pid]
            if action:
                for process in alive:
                    try:
                        getattr(process, action)()
                    except psutil.NoSuchProcess:
                        pass
            end = time.time() + grace
            while alive and time.time() < end:
                self._reap()
                alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
                if alive:
                    time.sleep(0.1)
            self._reap()
            if not alive:
                return

    @staticmethod
    def _reap():
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def report(self, code):
        """The exit status of the runner, after printing what horovodrun's ending needs: a worker's user
        error once (status 2) instead of horovodrun's traceback; for a worker that failed otherwise (a
        crash, a signal, an exception), one `error:` line naming it instead of that traceback; else the
        held lines."""
        if code != 0 and self.errors:
            for message in self.errors:
                self.err.write(f'error: {message}\n')
            self.err.flush()
            return 2
        failed = WORKER_FAILED.search(''.join(line for _, line in self.held))
        if code != 0 and failed:
            self.err.write(f'error: {worker_failure(failed.group("rank"), int(failed.group("status")))}\n')
            self.err.flush()
            return code
        for target, line in self.held:
            target.write(line)
        for message in self.errors:
            self.err.write(f'error: {message}\n')
        self.out.flush()
        self.err.flush()
        return code


def started(command):
    """`command` as the Supervisor starts it: `horovodrun ...` becomes horovodrun.py with this interpreter."""
    return [sys.executable, HOROVODRUN] + command[1:] if command[:1] == ['horovodrun'] else command


def worker_failure(rank, status):
    """What happened to the first worker that failed, from horovodrun's report of it."""
    try:
        how = f'signal {signal.Signals(status - 128).name} (exit status {status})'
    except ValueError:
        how = f'exit status {status}'
    return (f'worker {rank} ended with {how}, and horovodrun stopped the others; its own output above says '
            'where. Checkpoints already written are intact: the same command resumes from the last one')
