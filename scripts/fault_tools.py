"""Helpers of scripts/fault_campaign.py: processes watched from outside, workspace snapshots, metrics and
states read back, train.py run in a forked child, and the campaign's training run (its command lines).

    job = Job(ws, argv, workers=2)         # a background run; job.reached(0, 3), job.freeze_in_write(prefix)
    code, out, err = run(argv)             # a run to its end;  run_forked(train_py_flags) without start-up
    before = snapshot(ws); ...; unchanged(before, ws)    # '' when nothing changed (logs may only grow)
"""
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import psutil

import bootstrap

ROOT = bootstrap.ROOT
bootstrap.on_path()   # the repository importable (run_forked imports train.py)
PY, RUNNER, TRAIN = sys.executable, os.path.join(ROOT, 'runner'), os.path.join(ROOT, 'train.py')
ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''))
LOGS = ('log.log', 'dllogger_log.log')
JOB_TIMEOUT = 420
ERROR_LINE = re.compile(r'^(?:[\w.-]+: )?error: ')

# The campaign's training run: ResNet-18 on 3x32x32 synthetic images, global batch 32, 2 epochs of 8 steps,
# with the weight average, the newest epoch file kept, and TensorBoard files, so their writes are killed too.
EPOCHS, BATCH = 2, 32
COMMON = ['--data-backend', 'synthetic', '--num-examples', '256', '--num-layers', '18', '--image-shape', '3,32,32',
          '--num-classes', '10', '--seed', '3', '--warmup-epochs', '1', '--disp-batches', '1', '--save-frequency', '1',
          '--model-ema', '--model-ema-decay', '0.8', '--keep-checkpoints', '1', '--tensorboard']


def runner_argv(ws, workers, *extra):
    return [PY, RUNNER, '-n', str(workers), '-b', str(BATCH // workers), '-e', str(EPOCHS), '-l', '0.8'] + \
        COMMON + ['--workspace', str(ws)] + [str(e) for e in extra]


def launch(ws, workers, *extra):
    """A background runner job of the campaign's training in `ws`."""
    return Job(ws, runner_argv(ws, workers, *extra), workers)


def train_argv(ws, *extra):
    return [PY, TRAIN, '--batch-size', str(BATCH), '--lr', '0.1', '--num-epochs', str(EPOCHS)] + COMMON + \
        ['--workspace', str(ws)] + [str(e) for e in extra]


def sha256(path):
    from rn50 import files   # imported when first needed, like the recipe's other modules here
    return files.file_sha256(path)


def snapshot(folder):
    """name -> SHA-256 of every file in `folder` (logs: their content, to check they only grew)."""
    if not os.path.isdir(folder):
        return {}
    return {name: open(os.path.join(folder, name), 'rb').read() if name in LOGS else sha256(os.path.join(folder, name))
            for name in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, name))}


def unchanged(before, folder):
    """'' if every file of `before` is still in `folder` unchanged (logs may grow), and no temporary appeared;
    else what changed."""
    after = snapshot(folder)
    changed = [n for n, v in before.items() if n not in after or
               (after[n][:len(v)] != v if n in LOGS else after[n] != v)]
    temporaries = [n for n in after if n.endswith('.tmp')]
    return ', '.join([f'{n} changed or lost' for n in changed] + [f'{n} left' for n in temporaries])


def link_copy(source, target):
    """A copy of a workspace: logs and folders (--tensorboard's, whose event files grow) copied, other files
    hard-linked (the recipe only ever replaces them)."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(target, name))
        else:
            (shutil.copyfile if name in LOGS else os.link)(path, os.path.join(target, name))


def epoch_metrics(ws):
    """Per-epoch metrics without their timings (logs.without_timings)."""
    from rn50.reports import logs
    path = os.path.join(ws, 'dllogger_log.log')
    if not os.path.exists(path):
        return []
    return [dict(logs.without_timings(r['data']), epoch=r['step'][0])    # not `|`: Python 3.8 (the container's)
            for r in logs.read_dllogger(path) if isinstance(r['step'], list) and len(r['step']) == 1]


def state_note(ws, name='model_last.state'):
    """(readable, text) of a workspace's state file."""
    from rn50.checkpoints import checkpoint
    from rn50.errors import RecipeError
    path = os.path.join(ws, name)
    if not os.path.exists(path):
        return True, 'no state'
    try:
        meta = checkpoint.read_state(path).meta
    except RecipeError as e:
        return False, f'state unreadable: {e}'
    return True, f'state at epoch {meta["epoch"]} it {meta["iteration"]}'


def temporaries(ws):
    return [n for n in os.listdir(ws) if n.endswith('.tmp')] if os.path.isdir(ws) else []


def run(argv, timeout=JOB_TIMEOUT, env=ENV, **kwargs):
    """(exit status, stdout, stderr); status None on timeout."""
    try:
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=timeout,
                                cwd=ROOT, **kwargs)
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or '', e.stderr or ''
    return result.returncode, result.stdout, result.stderr


def exit_code(status):
    """The exit code of a waitpid() status, negative for a signal: os.waitstatus_to_exitcode, which Python 3.8
    (NVIDIA's container) lacks."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def run_forked(argv, timeout=300):
    """`python train.py argv` without the interpreter start: train.main(argv) in a child forked from this
    process (train imported once), its stdout/stderr captured, an escaping exception printed as a traceback
    and a crash seen as a signal; (exit status, stdout, stderr), status None on timeout."""
    import tempfile
    import traceback
    import train
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.argv = [TRAIN] + argv
                code = train.main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        end = time.time() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.time() > end:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        code = None if status is None else exit_code(status)
        return code, out.read().decode(errors='replace'), err.read().decode(errors='replace')


class Job:
    """A background job (`argv`: the runner) in workspace `ws`, its output in `ws`.N.out, watched from outside."""

    def __init__(self, ws, argv, workers=1):
        self.ws, self.workers = str(ws), workers
        os.makedirs(self.ws, exist_ok=True)
        self.offsets = {n: os.path.getsize(os.path.join(self.ws, n)) if os.path.exists(os.path.join(self.ws, n))
                        else 0 for n in LOGS}
        number = len([n for n in os.listdir(os.path.dirname(self.ws)) if n.startswith(os.path.basename(self.ws) + '.')])
        self.output = f'{self.ws}.{number}.out'
        with open(self.output, 'w') as out:
            self.proc = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env=ENV,
                                         cwd=ROOT, start_new_session=True)
        self.writer = None
        self.stale = set(temporaries(self.ws))     # left by the previous kill: this job's start removes them

    def text(self, name):
        path = os.path.join(self.ws, name)
        if not os.path.exists(path):
            return ''
        with open(path, errors='replace') as f:
            f.seek(self.offsets[name])
            return f.read()

    def reached(self, epoch, iteration=None):
        """Whether this job logged the record [epoch, >= iteration] (or [epoch] without an iteration)."""
        for line in self.text('dllogger_log.log').splitlines():
            if '"step": [' in line:
                step = json.loads(line[5:])['step']
                if iteration is None and step == [epoch]:
                    return True
                if iteration is not None and len(step) == 2 and tuple(step) >= (epoch, iteration):
                    return True
        return False

    def wait_for(self, condition, timeout=JOB_TIMEOUT):
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            if condition():
                return True
            time.sleep(0.05)
        return False

    def workers_now(self):
        """The processes running train.py's main: the train.py programs the runner started, or, for one worker,
        the runner itself (it runs train.py's main in its own process: the runner's run_here)."""
        try:
            root = psutil.Process(self.proc.pid)
            found = []
            for p in [root] + root.children(recursive=True):
                try:
                    if p.cmdline()[1:2] == [TRAIN]:
                        found.append(p)
                except psutil.Error:
                    pass
            return found or ([root] if self.workers == 1 and root.cmdline()[1:2] == [RUNNER] else [])
        except psutil.Error:
            return []

    def rank(self, rank):
        for p in self.workers_now():
            try:
                if self.workers == 1 or p.environ().get('HOROVOD_RANK') == str(rank):
                    return p
            except psutil.Error:
                pass
        return None

    def freeze_in_write(self, prefix, timeout=JOB_TIMEOUT):
        """Wait for an atomic-write temporary `prefix*.tmp` of this job; freeze rank 0 (SIGSTOP) while it
        exists. Returns its name, or None if the job ended (or `timeout` passed) first."""
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            names = [n for n in os.listdir(self.ws) if n.startswith(prefix) and n.endswith('.tmp')
                     and n not in self.stale]
            if names:
                self.writer = self.writer or self.rank(0)
                if self.writer is not None:
                    self.writer.suspend()
                    if any(os.path.exists(os.path.join(self.ws, n)) for n in names):
                        return names[0]
                    self.writer.resume()
            time.sleep(0.002)
        return None

    def step_into_write(self, prefix, too_late, timeout=120, slice_s=0):
        """Run rank 0 in slices of `slice_s` (SIGCONT, sleep, SIGSTOP; 0: a yield of this process) until it is
        stopped while a temporary `prefix*.tmp` of this job exists (for files written too fast to catch by
        watching); its name, or None once `too_late()` or the job ended. The writer is left stopped. Each look
        waits for the stop to take hold (looking while the writer still ran, a file made after the look was
        gone by the next one). The final report, written in well under a millisecond, was missed in 4 of 7 runs
        with 0.5 ms slices, 1 of 6 with 0.1 ms slices, 1 of 8 with 0.1 ms and the wait, 0 of 8 with a yield and
        the wait (on a Zen 4)."""
        self.writer = self.writer or self.rank(0)
        end = time.time() + timeout
        while time.time() < end and self.writer is not None and self.proc.poll() is None:
            try:
                self.writer.suspend()
                stopped_by = time.time() + 0.05
                while self.writer.status() != psutil.STATUS_STOPPED and time.time() < stopped_by:
                    time.sleep(0)
            except psutil.Error:
                return None
            names = [n for n in os.listdir(self.ws) if n.startswith(prefix) and n.endswith('.tmp')
                     and n not in self.stale]
            if names:
                return names[0]
            if too_late():
                return None
            self.writer.resume()
            time.sleep(slice_s)
        return None

    def freeze(self):
        """SIGSTOP to every worker (what they logged until now is all they will log before the kill)."""
        for p in self.workers_now():
            try:
                p.suspend()
            except psutil.Error:
                pass
        return True

    def kill(self):
        """kill -9 of the job: every process of it."""
        try:
            root = psutil.Process(self.proc.pid)
            processes = root.children(recursive=True) + [root]
        except psutil.Error:
            processes = []
        for p in processes:
            try:
                p.kill()
            except psutil.Error:
                pass
        self.proc.wait()
        psutil.wait_procs(processes, timeout=10)

    def finish(self, timeout=JOB_TIMEOUT):
        """Exit status (None: killed after `timeout`)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def log(self):
        with open(self.output, errors='replace') as f:
            return f.read()


def one_error(code, out, err, about):
    """(ok, text) for the bad-input expectation: exit 2, exactly one error line, which contains `about` (an error
    about something else, such as another run's settings, does not count), no Traceback."""
    lines = [line for line in err.splitlines() if ERROR_LINE.match(line)]
    traceback = 'Traceback' in out + err
    elsewhere = bool(lines) and about not in lines[-1]
    text = f'exit {code}, {len(lines)} error lines{", Traceback" if traceback else ""}' + \
        (f', NOT ABOUT {about!r}' if elsewhere else '') + ': ' + \
        (lines[-1][:160] if lines else (err.strip().splitlines() or ['(no stderr)'])[-1][:160])
    return code == 2 and len(lines) == 1 and not traceback and not elsewhere, text


def file_size_limit(megabytes):
    def limit():    # in the child before exec: no file beyond the limit, and a write error instead of SIGXFSZ
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (megabytes << 20, megabytes << 20))
    return limit
