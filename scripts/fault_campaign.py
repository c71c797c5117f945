#!/usr/bin/env python
"""Fault campaign: kill, signal, damage and feed bad input to the recipe on small data, and check that
nothing is lost, nothing is silent, and every user error is one clear line.

    python scripts/fault_campaign.py -o campaign.json          # everything (about 25 min on 2 busy cores)
    python scripts/fault_campaign.py --quick                   # a few rows of every class, a few minutes
    python scripts/fault_campaign.py --only 'kill2|bad-input/weights'
    python scripts/fault_campaign.py --workdir /tmp/fc         # datasets and baselines are cached there

Every training run is ResNet-18 on 3x32x32 images through ./runner (horovodrun --gloo for 2 workers): 256
synthetic examples, global batch 32 (8 iterations per epoch), 2 epochs, --disp-batches 1, --save-frequency 1.
Rows are named "class/fault"; --only is a regular expression searched in that name. The classes:

  kill1, kill2    kill -9 (of the whole job) at many moments with 1 and 2 workers: inside an iteration, during
                  validation, during each checkpoint write (the writer is frozen with SIGSTOP while its
                  atomic-write temporary `.model_last.state.*.tmp` etc. exists, then killed), while resuming,
                  during the final report. Chained: the next run resumes each kill. Every row checks that the
                  kill hit its window, the state left is readable, the epochs logged so far equal an
                  uninterrupted run's; the last row that the finished run equals it (per-epoch metrics
                  without the speed fields) and no temporary is left.
  signal          SIGTERM / SIGUSR1 to the runner and to the workers: exit 0, the state written, resume equal.
  worker-lost     kill -9 of one worker of two: the job ends within a bound, no process left, resume equal.
  damaged-state   model_last.state with bytes overwritten, or truncated: exit 2, one error naming
                  model_prev.state, workspace unchanged; then --load model_prev.state finishes the run equal.
  write-failure   file-size limit (SIGXFSZ ignored), disk full (a small tmpfs) and a read-only workspace (a
                  tmpfs remounted read-only), both inside `unshare -m`; a workspace that is a file, one below
                  a file, a --logdir below a file.
  bad-input       flags out of range, impossible combinations, missing or corrupt data files, images for
                  --mode pred, weights files. Each: exit status 2, exactly one line starting with `error:`
                  (argparse's `prog: error:` counts; its `usage:` line may precede it), no Traceback, and every
                  file already in the workspace unchanged (SHA-256; the two log files may only grow).

The table goes to stdout (and to -o FILE as JSON); the exit status is 1 if any row is BAD.
"""
import argparse
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import psutil  # noqa: E402

PY, RUNNER, TRAIN = sys.executable, os.path.join(ROOT, 'runner'), os.path.join(ROOT, 'train.py')
ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''))
EPOCHS, BATCH, ITERATIONS = 2, 32, 8
COMMON = ['--data-backend', 'synthetic', '--num-examples', '256', '--num-layers', '18', '--image-shape', '3,32,32',
          '--num-classes', '10', '--seed', '3', '--warmup-epochs', '1', '--disp-batches', '1', '--save-frequency', '1']
LOGS = ('log.log', 'dllogger_log.log')
JOB_TIMEOUT = 420
ERROR_LINE = re.compile(r'^(?:[\w.-]+: )?error: ')


def runner_argv(ws, workers, *extra):
    return [PY, RUNNER, '-n', str(workers), '-b', str(BATCH // workers), '-e', str(EPOCHS), '-l', '0.8'] + \
        COMMON + ['--workspace', str(ws)] + [str(e) for e in extra]


def train_argv(ws, *extra):
    return [PY, TRAIN, '--batch-size', str(BATCH), '--lr', '0.1', '--num-epochs', str(EPOCHS)] + COMMON + \
        ['--workspace', str(ws)] + [str(e) for e in extra]


# ----------------------------------------------------------------------------------------------------------
# Small helpers: files, metrics, processes


def sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


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
    """A copy of a workspace: logs copied, other files hard-linked (the recipe only ever replaces them)."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    for name in os.listdir(source):
        (shutil.copyfile if name in LOGS else os.link)(os.path.join(source, name), os.path.join(target, name))


def epoch_metrics(ws):
    """Per-epoch metrics without the speed fields (tests/test_train.py metrics_without_speed)."""
    import logs
    path = os.path.join(ws, 'dllogger_log.log')
    if not os.path.exists(path):
        return []
    return [{k: v for k, v in r['data'].items() if not k.endswith(('ips', 'latency_avg'))} | {'epoch': r['step'][0]}
            for r in logs.read_dllogger(path) if isinstance(r['step'], list) and len(r['step']) == 1]


def state_note(ws, name='model_last.state'):
    """(readable, text) of a workspace's state file."""
    import checkpoint
    from errors import RecipeError
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


def run(argv, timeout=JOB_TIMEOUT, **kwargs):
    """(exit status, stdout, stderr); status None on timeout."""
    try:
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=ENV, timeout=timeout,
                                cwd=ROOT, **kwargs)
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or '', e.stderr or ''
    return result.returncode, result.stdout, result.stderr


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
        code = None if status is None else os.waitstatus_to_exitcode(status)
        return code, out.read().decode(errors='replace'), err.read().decode(errors='replace')


class Job:
    """A background runner (or train.py) job in workspace `ws`, output in `ws`.N.out, watched from outside."""

    def __init__(self, ws, workers=1, extra=(), argv=None, preexec=None):
        self.ws, self.workers = str(ws), workers
        os.makedirs(self.ws, exist_ok=True)
        self.offsets = {n: os.path.getsize(os.path.join(self.ws, n)) if os.path.exists(os.path.join(self.ws, n))
                        else 0 for n in LOGS}
        number = len([n for n in os.listdir(os.path.dirname(self.ws)) if n.startswith(os.path.basename(self.ws) + '.')])
        self.output = f'{self.ws}.{number}.out'
        with open(self.output, 'w') as out:
            self.proc = subprocess.Popen([str(a) for a in argv or runner_argv(self.ws, workers, *extra)], stdout=out,
                                         stderr=subprocess.STDOUT, env=ENV, cwd=ROOT, start_new_session=True,
                                         preexec_fn=preexec)
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
        try:
            root = psutil.Process(self.proc.pid)
            found = []
            for p in [root] + root.children(recursive=True):
                try:
                    if p.cmdline()[1:2] == [TRAIN]:
                        found.append(p)
                except psutil.Error:
                    pass
            return found
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


# ----------------------------------------------------------------------------------------------------------
# The campaign: rows, datasets, baselines


class Campaign:
    def __init__(self, workdir, quick, only):
        self.workdir, self.quick, self.only = os.path.abspath(workdir), quick, only and re.compile(only)
        self.rows = []
        os.makedirs(self.workdir, exist_ok=True)

    def selected(self, name):
        return self.only is None or bool(self.only.search(name))

    def row(self, name, expected, observed, ok, seconds):
        self.rows.append({'fault': name, 'expected': expected, 'observed': observed,
                          'verdict': 'OK' if ok else 'BAD', 'seconds': round(seconds, 1)})
        print(f'{"OK " if ok else "BAD"} {name:42s} {seconds:6.1f}s  {observed}', flush=True)

    def fresh(self, name):
        path = os.path.join(self.workdir, 'runs', name)
        shutil.rmtree(path, ignore_errors=True)
        for stale in [n for n in os.listdir(os.path.dirname(path)) if n.startswith(name + '.')] \
                if os.path.isdir(os.path.dirname(path)) else []:
            os.remove(os.path.join(os.path.dirname(path), stale))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def digits(self):
        """The demo dataset as RecordIO (cached)."""
        root = os.path.join(self.workdir, 'digits')
        if not os.path.exists(os.path.join(root, 'rec', 'val.idx')):
            run([PY, 'scripts/make_demo_dataset.py', os.path.join(root, 'images')])
            run([PY, 'scripts/prepare_dataset.py', os.path.join(root, 'images'), os.path.join(root, 'rec'),
                 '--names', os.path.join(root, 'images', 'names.txt'), '--workers', '2'])
        return os.path.join(root, 'rec')

    def baseline(self, workers):
        """An uninterrupted run's workspace (cached with the flags it was made with)."""
        ws = os.path.join(self.workdir, f'baseline-{workers}')
        key = json.dumps(runner_argv('WS', workers))
        marker = ws + '.done'
        if not (os.path.exists(marker) and open(marker).read() == key):
            shutil.rmtree(ws, ignore_errors=True)
            job = Job(ws, workers)
            if job.finish() != 0:
                raise SystemExit(f'the uninterrupted {workers}-worker run failed:\n{job.log()[-3000:]}')
            with open(marker, 'w') as f:
                f.write(key)
        return ws


# ----------------------------------------------------------------------------------------------------------
# kill -9 at many moments, chained


def reached_note(reached, note):
    return reached, note if reached else f'{note}: NEVER REACHED'


def at_record(epoch, iteration):
    return f'inside iteration {iteration + 1} of epoch {epoch}', lambda job: reached_note(
        job.wait_for(lambda: job.reached(epoch, iteration)), f'after record [{epoch}, {iteration}]')


def at_log(what, text):
    return what, lambda job: reached_note(job.wait_for(lambda: text in job.text('log.log')), f'after log "{text}"')


def in_write(name, label=''):
    def hit(job):
        tmp = job.freeze_in_write(f'.{name}.')
        return tmp is not None, f'{tmp} present at the kill' if tmp else 'write window not hit'
    return f'writing {name}{label}', hit


def final_report(job):
    """After the last epoch's state is renamed into place: the report.json writes and the summary (a small
    file's window is often too short to freeze in; the kill must at least come before the summary record)."""
    if not (job.wait_for(lambda: job.reached(EPOCHS - 1)) and job.freeze_in_write('.model_last.state.')):
        return False, 'the final state write was not caught'
    job.writer.resume()
    tmp = job.freeze_in_write('.report.json.', timeout=3)
    job.writer.suspend()
    before_summary = '"step": []' not in job.text('dllogger_log.log')
    return before_summary, (f'{tmp} present at the kill' if tmp else 'killed after the final state') + \
        ('' if before_summary else ', but the summary was already logged')


def stop_then_kill(signum):
    def hit(job):
        if not job.wait_for(lambda: job.reached(1, 2)):
            return False, 'iteration never reached'
        for p in job.workers_now():
            p.send_signal(signum)
        tmp = job.freeze_in_write('.model_last.state.')
        return tmp is not None, f'{signal.Signals(signum).name}, then {tmp} present at the kill' if tmp else \
            'stop-save window not hit'
    return 'during the stop-save after SIGTERM', hit


def validation_hit(job):
    reached = job.wait_for(lambda: 'Validating epoch 0' in job.text('log.log')) and job.freeze()
    return reached_note(reached and not job.reached(0), 'after "Validating epoch 0", before the epoch record')


KILL1 = [('at start-up', lambda job: reached_note(job.wait_for(
             lambda: '"PARAMETER"' in job.text('dllogger_log.log')) and job.freeze() and not job.reached(0, 0),
             'after the PARAMETER record, before the first iteration')),
         at_record(0, 3), ('during validation', validation_hit), in_write('model_0000.params'),
         in_write('model_best.params'), in_write('model_last.state', ' (the first)'), in_write('report.json'),
         at_log('while loading the state to resume', 'Resuming from'), at_record(1, 3),
         in_write('model_0001.params'), stop_then_kill(signal.SIGTERM),
         in_write('model_last.state', ' (model_prev.state kept)'), ('during the final report', final_report)]
KILL2 = [at_record(0, 3), ('during validation', validation_hit), in_write('model_best.params'),
         in_write('model_last.state', ' (the first)'), at_record(1, 3),
         at_log('while loading the state to resume', 'Resuming from'),
         in_write('model_last.state', ' (model_prev.state kept)'), ('during the final report', final_report)]
QUICK_KILLS = {'inside iteration 4 of epoch 0', 'writing model_last.state (the first)', 'during the final report'}


def kill_chain(camp, workers):
    klass = f'kill{workers}'
    moments = [(what, hit) for what, hit in (KILL1 if workers == 1 else KILL2)
               if camp.selected(f'{klass}/{what}') and (not camp.quick or what in QUICK_KILLS)]
    if not moments and not camp.selected(f'{klass}/resumed to the end'):
        return
    whole = epoch_metrics(camp.baseline(workers))
    ws = camp.fresh(klass)
    expected = 'killed inside the window; state readable; epochs so far equal'
    for what, hit in moments:
        start = time.time()
        job = Job(ws, workers)
        reached, note = hit(job)
        job.kill()
        readable, state = state_note(ws)
        so_far = epoch_metrics(ws)
        equal = so_far == whole[:len(so_far)]
        camp.row(f'{klass}/{what}', expected, f'{note}; {state}; {len(temporaries(ws))} tmp left; {len(so_far)} '
                 f'epochs logged, {"equal" if equal else "DIFFERENT"}', reached and readable and equal,
                 time.time() - start)
    start = time.time()
    job = Job(ws, workers)
    code = job.finish()
    final = epoch_metrics(ws)
    resumes = job.text('dllogger_log.log').count('"RESUME"')
    camp.row(f'{klass}/resumed to the end', 'exit 0, all epochs equal the uninterrupted run, no tmp',
             f'exit {code}, {len(final)} epochs {"equal" if final == whole else "DIFFERENT"}, resumed from a state '
             f'{resumes}x in this run, tmp left: {temporaries(ws) or "none"}',
             code == 0 and final == whole and not temporaries(ws), time.time() - start)


# ----------------------------------------------------------------------------------------------------------
# Signals and a lost worker


def signal_chain(camp, workers):
    """Stop by signal several times, each resumed by the next run; then finish and compare."""
    plans = {1: [('SIGTERM to the runner', 'runner', signal.SIGTERM, 0, 2),
                 ('SIGUSR1 to the runner', 'runner', signal.SIGUSR1, 1, 2)],
             2: [('SIGTERM to the runner', 'runner', signal.SIGTERM, 0, 1),
                 ('SIGUSR1 to the runner', 'runner', signal.SIGUSR1, 0, 5),
                 ('SIGTERM to both workers', 'workers', signal.SIGTERM, 1, 1),
                 ('SIGUSR1 to worker 1 alone', 'rank1', signal.SIGUSR1, 1, 5)]}[workers]
    plans = [p for p in plans if camp.selected(f'signal/{workers}w {p[0]}') and not (camp.quick and p[1] != 'runner')]
    if camp.quick:
        plans = plans[:1]
    if not plans:
        return
    whole = epoch_metrics(camp.baseline(workers))
    ws = camp.fresh(f'signal{workers}')
    for what, target, signum, epoch, iteration in plans:
        start = time.time()
        job = Job(ws, workers)
        reached = job.wait_for(lambda: job.reached(epoch, iteration))
        processes = job.workers_now()
        targets = {'runner': [psutil.Process(job.proc.pid)], 'workers': processes,
                   'rank1': [job.rank(1)]}[target]
        sent = time.time()
        for p in targets:
            p.send_signal(signum)
        code = job.finish(timeout=180)
        seconds = time.time() - sent
        left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        readable, state = state_note(ws)
        stopped = 'Stopped' in job.text('log.log')
        camp.row(f'signal/{workers}w {what}', 'exit 0 within 60 s, state written, no process left',
                 f'at record [{epoch}, {iteration}]: exit {code} {seconds:.0f} s after the signal; {state}; '
                 f'processes left {len(left)}', reached and code == 0 and seconds < 60 and stopped and readable
                 and not left and state != 'no state', time.time() - start)
    start = time.time()
    code = Job(ws, workers).finish()
    final = epoch_metrics(ws)
    camp.row(f'signal/{workers}w resumed to the end', 'exit 0, all epochs equal the uninterrupted run',
             f'exit {code}, {len(final)} epochs {"equal" if final == whole else "DIFFERENT"}',
             code == 0 and final == whole, time.time() - start)


def worker_lost(camp):
    if not camp.selected('worker-lost/kill -9 of worker 1 of 2'):
        return
    whole = epoch_metrics(camp.baseline(2))
    ws = camp.fresh('lost')
    start = time.time()
    job = Job(ws, 2)
    reached = job.wait_for(lambda: job.reached(1, 2))
    processes = psutil.Process(job.proc.pid).children(recursive=True)
    killed = time.time()
    job.rank(1).kill()
    code = job.finish(timeout=150)
    seconds = time.time() - killed
    left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    camp.row('worker-lost/kill -9 of worker 1 of 2', 'the job ends (non-zero) within 120 s, no process left',
             f'exit {code} {seconds:.0f} s after the kill; processes left {len(left)}',
             reached and code not in (0, None) and seconds < 120 and not left, time.time() - start)
    start = time.time()
    code = Job(ws, 2).finish()
    final = epoch_metrics(ws)
    camp.row('worker-lost/resumed to the end', 'exit 0, all epochs equal the uninterrupted run',
             f'exit {code}, {len(final)} epochs {"equal" if final == whole else "DIFFERENT"}',
             code == 0 and final == whole, time.time() - start)


# ----------------------------------------------------------------------------------------------------------
# Damaged states


def one_error(code, out, err):
    """(ok, text) for the bad-input expectation: exit 2, exactly one error line, no Traceback."""
    lines = [line for line in err.splitlines() if ERROR_LINE.match(line)]
    traceback = 'Traceback' in out + err
    text = f'exit {code}, {len(lines)} error lines{", Traceback" if traceback else ""}: ' + \
        (lines[-1][:160] if lines else (err.strip().splitlines() or ['(no stderr)'])[-1][:160])
    return code == 2 and len(lines) == 1 and not traceback, text


def damaged_state(camp):
    whole = epoch_metrics(camp.baseline(1))
    for damage in ('bytes overwritten', 'truncated'):
        name = f'damaged-state/model_last.state {damage}'
        if not camp.selected(name) or (camp.quick and damage == 'truncated'):
            continue
        start = time.time()
        ws = camp.fresh('damaged')
        shutil.copytree(camp.baseline(1), ws, dirs_exist_ok=True)
        path = os.path.join(ws, 'model_last.state')
        content = bytearray(open(path, 'rb').read())
        middle = len(content) // 2
        content = content[:middle] if damage == 'truncated' else \
            content[:middle] + bytes(64) + content[middle + 64:]
        open(path, 'wb').write(content)
        before = snapshot(ws)
        code, out, err = run(runner_argv(ws, 1))
        ok, text = one_error(code, out, err)
        names_prev = f'--load {os.path.join(ws, "model_prev.state")}' in err
        changes = unchanged(before, ws)
        camp.row(name, 'exit 2, one error naming model_prev.state, workspace unchanged',
                 f'{text}; {"names" if names_prev else "does NOT name"} model_prev.state; {changes or "unchanged"}',
                 ok and names_prev and not changes, time.time() - start)
        start = time.time()
        code, out, err = run(runner_argv(ws, 1, '--load', os.path.join(ws, 'model_prev.state')))
        final = epoch_metrics(ws)
        camp.row(f'{name}: --load model_prev.state', 'exit 0, all epochs equal the uninterrupted run',
                 f'exit {code}, {len(final)} epochs {"equal" if final == whole else "DIFFERENT"}',
                 code == 0 and final == whole, time.time() - start)


# ----------------------------------------------------------------------------------------------------------
# Write failures


def file_size_limit(megabytes):
    def limit():    # in the child before exec: no file beyond the limit, and a write error instead of SIGXFSZ
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (megabytes << 20, megabytes << 20))
    return limit


def write_failure_cases(camp):
    """(name, argv, preexec, workspace to check or None, expected error text)."""
    plain = os.path.join(camp.workdir, 'plain-file')
    with open(plain, 'w') as f:
        f.write('not a folder\n')
    limited = [os.path.join(camp.workdir, 'runs', f'limited{n}') for n in (60, 20)]   # baseline copies
    mount = os.path.join(camp.workdir, 'mnt')
    os.makedirs(mount, exist_ok=True)

    def namespace(setup, argv):   # a private mount namespace; the workspace is inspected from inside it
        return ['unshare', '-m', 'sh', '-c', f'mount -t tmpfs -o size=250m tmpfs {mount} && {setup}'
                f'{shlex.join(argv)}; code=$?; {shlex.join([PY, os.path.abspath(__file__), "--inspect", mount])} >&2; '
                'exit $code']
    return [('file-size limit 60 MB: the 90 MB state', runner_argv(limited[0], 1, '-e', '3'), file_size_limit(60),
             limited[0], 'could not write'),
            ('file-size limit 20 MB: the optimizer state', runner_argv(limited[1], 1, '-e', '3'), file_size_limit(20),
             limited[1], 'could not pass the optimizer state'),
            ('disk full (tmpfs of 250 MB)', namespace('', runner_argv(mount, 1, '-e', '3')), None, None,
             'could not write'),
            ('read-only workspace (tmpfs remounted ro)', namespace(f'echo kept > {mount}/notes.txt && mount -o '
                                                                   f'remount,ro {mount} && ', runner_argv(mount, 1)),
             None, None, 'not writable'),
            ('workspace is a file', runner_argv(plain, 1), None, None, 'is a file, not a folder'),
            ('workspace below a file', runner_argv(os.path.join(plain, 'ws'), 1), None, None, 'not writable'),
            ('--logdir below a file', runner_argv(os.path.join(camp.workdir, 'runs', 'logdir'), 1, '--logdir',
                                                  os.path.join(plain, 'logs')), None, None, 'not writable')]


def write_failures(camp):
    for name, argv, preexec, ws, message in write_failure_cases(camp):
        if not camp.selected(f'write-failure/{name}') or (camp.quick and 'below' in name):
            continue
        start = time.time()
        if ws:
            link_copy(camp.baseline(1), ws)
        before, plain = (snapshot(ws) if ws else {}), sha256(os.path.join(camp.workdir, 'plain-file'))
        code, out, err = run(argv, preexec_fn=preexec)
        ok, text = one_error(code, out, err)
        problems = [f'{n} left' for n in temporaries(ws)] if ws else []
        failed = re.search(r'could not write (\S+): ', err)
        if ws and failed and os.path.basename(failed.group(1)) in before:    # the old version of that file kept
            name_ = os.path.basename(failed.group(1))
            if sha256(failed.group(1)) != before[name_]:
                problems.append(f'{name_} changed')
        inside = re.search(r'^INSPECT (.*)$', err, re.M)
        if inside:    # the tmpfs workspace, seen from inside its mount namespace
            found = json.loads(inside.group(1))
            problems += [f'{n} left' for n in found['files'] if n.endswith('.tmp')]
            text += f'; left {len(found["files"])} files, {found["state"]}'
            ok = ok and not found['state'].startswith('state unreadable')
        if sha256(os.path.join(camp.workdir, 'plain-file')) != plain:
            problems.append('plain-file changed')
        camp.row(f'write-failure/{name}', f'exit 2, one error ({message}), the old file kept, no tmp left',
                 f'{text}; {", ".join(problems) or "old file kept, no tmp"}', ok and message in err and not problems,
                 time.time() - start)


def inspect(folder):
    """--inspect: what a workspace holds, as one line (used inside a mount namespace)."""
    print('INSPECT ' + json.dumps({'files': sorted(os.listdir(folder)), 'state': state_note(folder)[1]}))


# ----------------------------------------------------------------------------------------------------------
# Bad input: files to feed, the cases, and the check


def bad_files(camp):
    """Damaged data, images and weights files in WORKDIR/bad (made once); returns the folder."""
    folder = os.path.join(camp.workdir, 'bad')
    if os.path.exists(os.path.join(folder, 'done')):
        return folder
    import mxnet as mx
    import models
    os.makedirs(folder, exist_ok=True)
    rec = camp.digits()
    train_rec = open(os.path.join(rec, 'train.rec'), 'rb').read()
    files = {'garbage.rec': os.urandom(50000), 'truncated.rec': train_rec[:len(train_rec) // 3],
             'garbage.idx': b'hello world\n', 'empty.idx': b'', 'text.jpg': b'hello, not an image\n', 'empty.png': b'',
             'text.params': b'not weights\n', 'weights.pth': b'\x80\x02}q\x00.', 'weights.txt': b'1 2 3\n',
             'garbage.npz': b'PK\x03\x04 not a zip archive', 'truncated.safetensors': b'\xff\x00\x00\x00\x00\x00\x00'}
    for name, content in files.items():
        with open(os.path.join(folder, name), 'wb') as f:
            f.write(content)
    os.makedirs(os.path.join(folder, 'no-images'), exist_ok=True)
    open(os.path.join(folder, 'no-images', 'readme.txt'), 'w').write('no images here\n')
    os.makedirs(os.path.join(folder, 'bad-images'), exist_ok=True)
    shutil.copyfile(os.path.join(folder, 'text.jpg'), os.path.join(folder, 'bad-images', 'a.jpg'))
    source = mx.recordio.MXIndexedRecordIO(os.path.join(rec, 'train.idx'), os.path.join(rec, 'train.rec'), 'r')
    for name, change in (('labels99', lambda i, h, img: (h._replace(label=99.0) if i == 7 else h, img)),
                         ('undecodable', lambda i, h, img: (h, b'not a jpeg' * 20 if i == 5 else img))):
        out = mx.recordio.MXIndexedRecordIO(os.path.join(folder, f'{name}.idx'), os.path.join(folder, f'{name}.rec'),
                                            'w')
        for i in range(64):
            header, image = mx.recordio.unpack(source.read_idx(source.keys[i]))
            out.write_idx(i, mx.recordio.pack(*change(i, header, image)))
        out.close()
    best = os.path.join(camp.baseline(1), 'model_best.params')
    shutil.copyfile(best, os.path.join(folder, 'copy.params'))
    content = open(best, 'rb').read()
    open(os.path.join(folder, 'truncated.params'), 'wb').write(content[:len(content) // 2])
    state = open(os.path.join(camp.baseline(1), 'model_last.state'), 'rb').read()
    open(os.path.join(folder, 'damaged.state'), 'wb').write(state[:len(state) - 1000])
    for name, layers, classes in (('resnet34.params', 34, 10), ('classes5.params', 18, 5)):
        net = models.get_model(num_layers=layers, num_classes=classes, image_shape=(3, 32, 32))
        net.initialize()
        net.save_parameters(os.path.join(folder, name))
    mx.nd.save(os.path.join(folder, 'list.params'), [mx.nd.ones((2, 2))])
    open(os.path.join(folder, 'done'), 'w').close()
    return folder


def bad_inputs(camp):
    """(name, kind, extra flags): kind 'train' runs train.py, 'runner1'/'runner2' the runner with 1/2 workers."""
    rec, bad = camp.digits(), bad_files(camp)
    r, b = (lambda name: os.path.join(rec, name)), (lambda name: os.path.join(bad, name))

    def data(train_rec=r('train.rec'), train_idx=r('train.idx'), backend='mxnet', val=True):
        flags = ['--data-backend', backend, '--data-train', train_rec, '--data-train-idx', train_idx,
                 '--data-val-resize', '32']
        return flags + (['--data-val', r('val.rec'), '--data-val-idx', r('val.idx')] if val else [])

    def undecodable(backend):   # one more epoch than the workspace's finished run, so the data are read
        return data(b('undecodable.rec'), b('undecodable.idx'), backend) + ['--num-epochs', '3', '--num-examples', '64']
    cases = [(f'flag {" ".join(f)}', 'train', f) for f in (
        ['--batch-size', '0'], ['--batch-size', '-32'], ['--lr', '-1'], ['--lr', 'nan'], ['--lr', 'inf'],
        ['--wd', 'nan'], ['--mom', '1.5'], ['--label-smoothing', '2'], ['--mixup', '-1'], ['--warmup-epochs', '-1'],
        ['--num-epochs', '0'], ['--run-epochs', '0'], ['--disp-batches', '0'], ['--seed', '-1'],
        ['--num-layers', 'x'], ['--num-layers', '19'], ['--num-classes', '0'], ['--image-shape', '2,32,32'],
        ['--image-shape', '3,32'], ['--rgb-mean', '1,inf,2'], ['--gpus', '0,-1'], ['--save-frequency', '-2'],
        ['--topk', '0'], ['--num-examples', '0'], ['--batchnorm-eps', '0'], ['--dali-threads', '0'],
        ['--no-such-flag'], ['--mode', 'bogus'])]
    cases += [(f'runner {" ".join(f)}', 'runner1', f) for f in (
        ['-n', '0'], ['-b', '0'], ['-l', 'nan'], ['-e', '0'], ['--stop-timeout', '0'])]
    cases += [('runner -n 2 with train.py flag --lr-factor 0', 'runner2', ['--lr-factor', '0'])]
    cases += [(f'combination {name}', kind, flags) for name, kind, flags in (
        ('dali-gpu without a GPU', 'train', ['--data-backend', 'dali-gpu']),
        ('float16 on the CPU', 'train', ['--dtype', 'float16']),
        ('--gpus 0 without a GPU', 'train', ['--gpus', '0']),
        ('train_val without --data-val', 'train', data(val=False)),
        ('--quantize int8 in train mode', 'train', ['--quantize', 'int8']),
        ('--quantize int8 with export', 'train', ['--mode', 'export', '--quantize', 'int8']),
        ('pred without --data-pred', 'train', ['--mode', 'pred']),
        ('--rgb-mean with 2 values', 'train', ['--rgb-mean', '1,2']),
        ('--data-val-resize below the image', 'train', ['--data-val-resize', '16']),
        ('min random area above max', 'train', ['--min-random-area', '0.9', '--max-random-area', '0.5']),
        ('--random-crop with dali-cpu', 'train', data(backend='dali-cpu') + ['--random-crop', '1']),
        ('--optimizer nosuch', 'train', ['--optimizer', 'nosuch']),
        ('-n 2 --kv-store device on CPUs', 'runner2', ['--kv-store', 'device']),
        ('--test-io-mode val without --data-val', 'train', data(val=False) + ['--test-io', '--test-io-mode', 'val']),
        ('NHWC convolutions on the CPU', 'train', ['--conv-layout', 'NHWC']),
        ('resume a ResNet-18 state as ResNet-34', 'train', ['--num-layers', '34']),
        ('resume a 10-class state with 5 classes', 'train', ['--num-classes', '5']))]
    cases += [(f'data {name}', 'train', flags) for name, flags in (
        ('missing .rec', data(train_rec=b('missing.rec'))),
        ('missing .idx', data(train_idx=b('missing.idx'))),
        ('garbage .rec', data(train_rec=b('garbage.rec'))),
        ('garbage .rec (dali-cpu)', data(train_rec=b('garbage.rec'), backend='dali-cpu')),
        ('truncated .rec', data(train_rec=b('truncated.rec'))),
        ('garbage .idx', data(train_idx=b('garbage.idx'))),
        ('empty .idx', data(train_idx=b('empty.idx'))),
        ('.idx of another .rec', data(train_idx=r('val.idx'))),
        ('label 99 of 10 classes', data(train_rec=b('labels99.rec'), train_idx=b('labels99.idx'))),
        ('undecodable image (mxnet)', undecodable('mxnet')), ('undecodable image (dali-cpu)', undecodable('dali-cpu')),
        ('--mode val with a missing .rec', ['--mode', 'val', '--data-backend', 'mxnet', '--data-val',
                                            b('missing.rec'), '--data-val-idx', r('val.idx')]))]
    cases += [(f'pred {name}', 'train', ['--mode', 'pred', '--data-pred', path]) for name, path in (
        ('text file named .jpg', b('text.jpg')), ('empty .png', b('empty.png')),
        ('folder without images', b('no-images')), ('missing path', b('missing.jpg')),
        ('folder of unreadable images', b('bad-images')))]
    cases += [(f'weights {name}', 'train', ['--mode', 'val', '--load', b(file)]) for name, file in (
        ('text in .params', 'text.params'), ('truncated .params', 'truncated.params'),
        ('ResNet-34 into ResNet-18', 'resnet34.params'), ('5 classes into 10', 'classes5.params'),
        ('.pth pickle', 'weights.pth'), ('unknown suffix .txt', 'weights.txt'), ('missing file', 'missing.params'),
        ('garbage .npz', 'garbage.npz'), ('truncated .safetensors', 'truncated.safetensors'),
        ('unnamed list of arrays', 'list.params'), ('truncated .state', 'damaged.state'))]
    return cases


def bad_input_template(camp):
    """A workspace with a finished run's weights, last state and logs (what a bad input must not touch)."""
    template = os.path.join(camp.workdir, 'bad-template')
    if not os.path.exists(os.path.join(template, 'model_last.state')):
        os.makedirs(template, exist_ok=True)
        for name in ('model_best.params', 'model_last.state', 'report.json') + LOGS:
            shutil.copyfile(os.path.join(camp.baseline(1), name), os.path.join(template, name))
    return template


def bad_input_row(camp, template, number, name, kind, extra):
    start = time.time()
    ws = os.path.join(camp.workdir, 'runs', f'bad{number:02d}')
    link_copy(template, ws)
    before = snapshot(ws)
    if kind == 'train':
        code, out, err = run_forked([str(a) for a in train_argv(ws, *extra)[2:]])
    else:
        code, out, err = run(runner_argv(ws, int(kind[-1]), *extra), timeout=300)
    ok, text = one_error(code, out, err)
    changes = unchanged(before, ws)
    shutil.rmtree(ws, ignore_errors=True)
    return f'bad-input/{name}', ok and not changes, f'{text}; {changes or "workspace unchanged"}', time.time() - start


def bad_input_campaign(camp):
    cases = [c for c in bad_inputs(camp) if camp.selected(f'bad-input/{c[0]}')]
    if camp.quick:
        cases = cases[::6]
    template = bad_input_template(camp)
    expected = 'exit 2, one error: line, no Traceback, workspace unchanged'
    for i, case in enumerate(cases):     # one at a time: forking from a threaded process is unsafe
        name, ok, observed, seconds = bad_input_row(camp, template, i, *case)
        camp.row(name, expected, observed, ok, seconds)


# ----------------------------------------------------------------------------------------------------------
# Main


CLASSES = ['kill1', 'kill2', 'signal', 'worker-lost', 'damaged-state', 'write-failure', 'bad-input']


def summary(rows):
    lines = ['| class | rows | OK | BAD |', '|---|---|---|---|']
    for klass in CLASSES:
        mine = [r for r in rows if r['fault'].split('/')[0] == klass]
        if mine:
            ok = sum(r['verdict'] == 'OK' for r in mine)
            lines.append(f'| {klass} | {len(mine)} | {ok} | {len(mine) - ok} |')
    ok = sum(r['verdict'] == 'OK' for r in rows)
    lines.append(f'| all | {len(rows)} | {ok} | {len(rows) - ok} |')
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workdir', default='/tmp/fault_campaign', help='datasets, baselines and runs (cached)')
    parser.add_argument('--quick', action='store_true', help='a subset of every class of fault')
    parser.add_argument('--only', help='regular expression: run the rows whose "class/fault" name matches')
    parser.add_argument('-o', '--output', help='write the rows as JSON to this file')
    parser.add_argument('--inspect', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inspect:
        inspect(args.inspect)
        return 0
    camp = Campaign(args.workdir, args.quick, args.only)
    start = time.time()
    camp.digits()
    for step in (lambda: kill_chain(camp, 1), lambda: kill_chain(camp, 2), lambda: signal_chain(camp, 1),
                 lambda: signal_chain(camp, 2), lambda: worker_lost(camp), lambda: damaged_state(camp),
                 lambda: write_failures(camp), lambda: bad_input_campaign(camp)):
        step()
    minutes = (time.time() - start) / 60
    print(f'\n| fault | expected | observed | verdict |\n|---|---|---|---|')
    for r in camp.rows:
        print(f'| {r["fault"]} | {r["expected"]} | {r["observed"]} | {r["verdict"]} |')
    print(f'\n{summary(camp.rows)}\n\n{len(camp.rows)} rows in {minutes:.1f} min')
    if args.output:
        with open(args.output, 'w') as f:
            json.dump({'command': sys.argv, 'minutes': round(minutes, 1), 'rows': camp.rows}, f, indent=2)
    return 1 if any(r['verdict'] == 'BAD' for r in camp.rows) else 0


if __name__ == '__main__':
    sys.exit(main())
