#!/usr/bin/env python3
"""Fault campaign: kill, signal, damage and feed bad input to the recipe on small data, and check that
nothing is lost, nothing is silent, and every user error is one clear line.

    python scripts/fault_campaign.py -o campaign.json          # everything (about 10 min on 2 shared cores)
    python scripts/fault_campaign.py --quick                   # a few rows of every class, a few minutes
    python scripts/fault_campaign.py --only 'kill2|bad-input/weights'
    python scripts/fault_campaign.py --only '^soak' --soak-epochs 20      # the soak class alone
    python scripts/fault_campaign.py --workdir /tmp/fc         # datasets and baselines are cached there

Every training run is ResNet-18 on 3x32x32 images through ./runner (horovodrun --gloo for 2 workers): 256
synthetic examples, global batch 32 (8 iterations per epoch), 2 epochs, --disp-batches 1, --save-frequency 1,
--model-ema, --keep-checkpoints 1, --tensorboard.
Rows are named "class/fault"; --only is a regular expression searched in that name. The classes:

  kill1, kill2    kill -9 (of the whole job) at many moments with 1 and 2 workers: inside an iteration, during
                  validation, during each checkpoint write (the writer is frozen with SIGSTOP while its
                  atomic-write temporary `.model_last.state.*.tmp` etc. exists, then killed), while resuming,
                  during the final report. Chained: the next run resumes each kill. Every row checks that the
                  kill hit its window, the state left is readable, the epochs logged so far equal an
                  uninterrupted run's; the last row that the finished run equals it (per-epoch metrics
                  without the speed fields) and no temporary is left.
  signal          SIGTERM / SIGUSR1 to the runner and to the workers: exit 0, the state written, resume equal.
  worker-lost     kill -9 of one worker of two: the job ends within a bound, no process left, one error line
                  naming the worker, resume equal.
  start-up        the 2-worker run started --starts times (each killed at its second iteration): every start
                  gets there (a rare crash at start-up is caught here).
  damaged-state   model_last.state with bytes overwritten, or truncated: exit 2, one error naming
                  model_prev.state, workspace unchanged; then --load model_prev.state finishes the run equal.
  write-failure   file-size limit (SIGXFSZ ignored), disk full (a small tmpfs) and a read-only workspace (a
                  tmpfs remounted read-only), both inside `unshare -m`; a workspace that is a file, one below
                  a file, a --logdir below a file.
  bad-input       flags out of range, impossible combinations, missing or corrupt data files, images for
                  --mode pred, weights files. Each: exit status 2, exactly one line starting with `error:`
                  (argparse's `prog: error:` counts; its `usage:` line may precede it), no Traceback, and every
                  file already in the workspace unchanged (SHA-256; the two log files may only grow).
  soak            --soak-epochs epochs of the loaders of 2 workers of each training backend (mxnet, dali-cpu,
                  synthetic) on 20,000 small JPEGs, every 4th epoch abandoned midway, and a train.py run of as
                  many short epochs (scripts/fault_soak.py): no failure, no temporary file left; and as many
                  2-worker runner runs stopped by SIGTERM 2 s into training: each exits 0 with its state.

The table goes to stdout (and to -o FILE as JSON); the exit status is 1 if any row is BAD.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import sys
import time

import bootstrap
bootstrap.start()   # .venv in a fresh shell: before psutil and the recipe's packages

import psutil  # noqa: E402

from fault_inputs import bad_input_campaign, bad_input_commands  # noqa: E402
from fault_soak import soak_campaign, soak_commands  # noqa: E402
from fault_tools import (EPOCHS, PY, ROOT,  # noqa: E402
                          epoch_metrics, file_size_limit, launch, link_copy, one_error,
                         run, runner_argv, sha256, snapshot, state_note, temporaries, unchanged)

# ----------------------------------------------------------------------------------------------------------
# The campaign: rows, datasets, baselines


class Campaign:
    def __init__(self, workdir, quick, only, starts=10):
        self.workdir, self.quick, self.only = os.path.abspath(workdir), quick, only and re.compile(only)
        self.starts = starts
        self.rows = []
        os.makedirs(self.workdir, exist_ok=True)

    def selected(self, name):
        return self.only is None or bool(self.only.search(name))

    def row(self, name, expected, observed, ok, seconds):
        self.rows.append({'fault': name, 'expected': expected, 'observed': observed,
                          'verdict': 'OK' if ok else 'BAD', 'seconds': round(seconds, 1)})
        print(f'{"OK " if ok else "BAD"} {name:42s} {seconds:6.1f}s  {observed}', flush=True)

    def fresh(self, name):
        """An empty workspace WORKDIR/runs/NAME (its jobs' output goes to NAME.N.out beside it)."""
        runs = os.path.join(self.workdir, 'runs')
        os.makedirs(runs, exist_ok=True)
        for old in [n for n in os.listdir(runs) if n == name or n.startswith(name + '.')]:
            shutil.rmtree(os.path.join(runs, old), ignore_errors=True) if old == name else \
                os.remove(os.path.join(runs, old))
        return os.path.join(runs, name)

    def digits(self, make=True):
        """The demo dataset's RecordIO folder (made once; `make` False: its name only)."""
        root = os.path.join(self.workdir, 'digits')
        if make and not os.path.exists(os.path.join(root, 'rec', 'val.idx')):
            for argv in digits_commands(root):
                run(argv)
        return os.path.join(root, 'rec')

    def baseline(self, workers):
        """An uninterrupted run's workspace (cached with its flags and the recipe's code)."""
        ws = os.path.join(self.workdir, f'baseline-{workers}')
        code = [os.path.join(ROOT, n) for n in sorted(os.listdir(ROOT)) if n.endswith('.py') or n == 'runner']
        key = json.dumps([runner_argv('WS', workers)] + [sha256(path) for path in code])   # redone on changes
        marker = ws + '.done'
        if not (os.path.exists(marker) and open(marker).read() == key):
            shutil.rmtree(ws, ignore_errors=True)
            job = launch(ws, workers)
            if job.finish() != 0:
                raise SystemExit(f'the uninterrupted {workers}-worker run failed:\n{job.log()[-3000:]}')
            with open(marker, 'w') as f:
                f.write(key)
        return ws


def digits_commands(root):
    """The demo dataset's images in `root`/images, then their RecordIO files in `root`/rec."""
    images = os.path.join(root, 'images')
    return [[PY, 'scripts/make_demo_dataset.py', images],
            [PY, 'scripts/prepare_dataset.py', images, os.path.join(root, 'rec'), '--names',
             os.path.join(images, 'names.txt'), '--workers', '2']]


# ----------------------------------------------------------------------------------------------------------
# kill -9 at many moments, chained


def reached_note(reached, note):
    return reached, note if reached else f'{note}: NEVER REACHED'


def at_record(epoch, iteration):
    return f'inside iteration {iteration + 1} of epoch {epoch}', lambda job: reached_note(
        job.wait_for(lambda: job.reached(epoch, iteration)), f'after record [{epoch}, {iteration}]')


def at_log(what, text):
    return what, lambda job: reached_note(job.wait_for(lambda: text in job.text('log.log')), f'after log "{text}"')


def ended(job):
    """Why a job ended before its moment: its exit status and the last line saying why."""
    why = [line for line in job.log().splitlines() if re.search(r'Segmentation fault|error:|Error', line)]
    return f'the job ended first (exit {job.proc.returncode}{": " + why[0][-60:] if why else ""})'


def in_write(name, label=''):
    def hit(job):
        tmp = job.freeze_in_write(f'.{name}.')
        return tmp is not None, f'{tmp} present at the kill' if tmp else \
            ended(job) if job.proc.poll() is not None else 'write window not hit'
    return f'writing {name}{label}', hit


def report_write(epoch):
    """A report.json write, caught by running the writer in short slices (the small file's window is too short to
    catch by watching). Of an epoch before the last: fit.py writes it once the epoch's validation is over and its
    checkpoint files are queued, before the epoch's DLLogger record, so the writer is stepped from "Validating epoch
    N" until that record. After the last epoch, train.py's final report: stepped from the last state write (caught
    while it lasts) until the summary record."""
    def hit(job):
        if epoch < EPOCHS - 1:
            if not job.wait_for(lambda: f'Validating epoch {epoch}' in job.text('log.log')):
                return False, f'epoch {epoch} was not validated'
            tmp = job.step_into_write('.report.json.', lambda: job.reached(epoch))
        else:
            if not (job.wait_for(lambda: job.reached(epoch)) and job.freeze_in_write('.model_last.state.')):
                return False, f'the state write of epoch {epoch} was not caught'
            tmp = job.step_into_write('.report.json.', lambda: '"step": []' in job.text('dllogger_log.log'))
        return tmp is not None, f'{tmp} present at the kill' if tmp else 'report window not hit'
    return hit


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


FINAL_REPORT = ('during the final report', report_write(EPOCHS - 1))
KILL1 = [('at start-up', lambda job: reached_note(job.wait_for(
             lambda: '"PARAMETER"' in job.text('dllogger_log.log')) and job.freeze() and not job.reached(0, 0),
             'after the PARAMETER record, before the first iteration')),
         at_record(0, 3), ('during validation', validation_hit), in_write('model_0000.params'),
         in_write('model_best.params'), in_write('model_ema_best.params'), in_write('model_last.state', ' (the first)'),
         # epoch 0's report is written while its state is still being written in the background: the kill leaves
         # no state, and the run killed in epoch 1 next leaves epoch 0's, which the one after resumes from
         ('writing report.json', report_write(0)), at_record(1, 3),
         at_log('while loading the state to resume', 'Resuming from'), in_write('model_0001.params'),
         stop_then_kill(signal.SIGTERM),
         in_write('model_last.state', ' (model_prev.state kept)'), FINAL_REPORT]
KILL2 = [at_record(0, 3), ('during validation', validation_hit), in_write('model_best.params'),
         in_write('model_ema_best.params'),
         in_write('model_last.state', ' (the first)'), at_record(1, 3),
         at_log('while loading the state to resume', 'Resuming from'),
         in_write('model_last.state', ' (model_prev.state kept)'), FINAL_REPORT]
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
        job = launch(ws, workers)
        reached, note = hit(job)
        job.kill()
        readable, state = state_note(ws)
        so_far = epoch_metrics(ws)
        equal = so_far == whole[:len(so_far)]
        camp.row(f'{klass}/{what}', expected, f'{note}; {state}; {len(temporaries(ws))} tmp left; {len(so_far)} '
                 f'epochs logged, {"equal" if equal else "DIFFERENT"}', reached and readable and equal,
                 time.time() - start)
    start = time.time()
    job = launch(ws, workers)
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
        job = launch(ws, workers)
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
    code = launch(ws, workers).finish()
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
    job = launch(ws, 2)
    reached = job.wait_for(lambda: job.reached(1, 2))
    processes = psutil.Process(job.proc.pid).children(recursive=True)
    killed = time.time()
    job.rank(1).kill()
    code = job.finish(timeout=150)
    seconds = time.time() - killed
    left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    last = (job.log().strip().splitlines() or [''])[-1]
    named = last.startswith('error: worker 1 ended with signal SIGKILL')
    camp.row('worker-lost/kill -9 of worker 1 of 2', 'the job ends (non-zero) within 120 s, no process left, '
             'its last line an error naming worker 1 and SIGKILL',
             f'exit {code} {seconds:.0f} s after the kill; processes left {len(left)}; last line {last[:60]!r}',
             reached and code not in (0, None) and seconds < 120 and not left and named, time.time() - start)
    start = time.time()
    code = launch(ws, 2).finish()
    final = epoch_metrics(ws)
    camp.row('worker-lost/resumed to the end', 'exit 0, all epochs equal the uninterrupted run',
             f'exit {code}, {len(final)} epochs {"equal" if final == whole else "DIFFERENT"}',
             code == 0 and final == whole, time.time() - start)


def repeated_starts(camp):
    """The 2-worker run started camp.starts times, each killed once it logged its second iteration: every start
    must get there (Horovod 0.28.1's own broadcast crashed about one start in 25; see workers.Communicator)."""
    name = f'start-up/{camp.starts} starts of 2 workers'
    if not camp.starts or not camp.selected(name):
        return
    start, failed = time.time(), []
    for attempt in range(camp.starts):
        job = launch(camp.fresh('starts'), 2)
        if not job.wait_for(lambda: job.reached(0, 1), timeout=120):
            failed.append(f'start {attempt + 1}: {ended(job)}')
        job.kill()
    camp.row(name, 'each reaches its second iteration', f'{camp.starts - len(failed)} of {camp.starts} did'
             + ''.join(f'; {f}' for f in failed[:3]), not failed, time.time() - start)


# ----------------------------------------------------------------------------------------------------------
# Damaged states


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
        ok, text = one_error(code, out, err, 'model_last.state')
        names_prev = f'--load {os.path.join(ws, "model_prev.state")}' in err
        changes = unchanged(before, ws)
        camp.row(name, 'exit 2, one error naming model_prev.state, workspace unchanged',
                 f'{text}; {"names" if names_prev else "does NOT name"} model_prev.state; {changes or "unchanged"}',
                 ok and names_prev and not changes, time.time() - start)
        start = time.time()
        code, out, err = run(from_previous_state(ws))
        final = epoch_metrics(ws)
        camp.row(f'{name}: --load model_prev.state', 'exit 0, all epochs equal the uninterrupted run',
                 f'exit {code}, {len(final)} epochs {"equal" if final == whole else "DIFFERENT"}',
                 code == 0 and final == whole, time.time() - start)


def from_previous_state(ws):
    """The damaged-state rows' second run: the training finished from `ws`'s model_prev.state."""
    return runner_argv(ws, 1, '--load', os.path.join(ws, 'model_prev.state'))


# ----------------------------------------------------------------------------------------------------------
# Write failures


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
    # The limited workspaces resume the baseline's run from its state after epoch 0 (write_failures): a workspace
    # holds one run, so its last epoch is trained again rather than the run lengthened.
    return [('file-size limit 60 MB: the 90 MB state', runner_argv(limited[0], 1), file_size_limit(60),
             limited[0], 'could not write'),
            ('file-size limit 20 MB: the optimizer state', runner_argv(limited[1], 1), file_size_limit(20),
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
            last = os.path.join(ws, 'model_last.state')
            os.remove(last)     # a hard link to the baseline's: replaced, not written through
            shutil.copyfile(os.path.join(ws, 'model_prev.state'), last)
        before, plain = (snapshot(ws) if ws else {}), sha256(os.path.join(camp.workdir, 'plain-file'))
        code, out, err = run(argv, preexec_fn=preexec)
        ok, text = one_error(code, out, err, message)
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
                 f'{text}; {", ".join(problems) or "old file kept, no tmp"}', ok and not problems,
                 time.time() - start)


def inspect(folder):
    """--inspect: what a workspace holds, as one line (used inside a mount namespace)."""
    print('INSPECT ' + json.dumps({'files': sorted(os.listdir(folder)), 'state': state_note(folder)[1]}))


# ----------------------------------------------------------------------------------------------------------
# Main


CLASSES = ['kill1', 'kill2', 'signal', 'worker-lost', 'start-up', 'damaged-state', 'write-failure', 'bad-input',
           'soak', 'campaign']


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


def command_lines(workdir, soak_epochs):
    """(row class or name, argv, about) of every command line the campaign's rows run (--quick runs some of these
    rows), built as the rows build them, without running any or making a dataset: `about` is None where the
    script must accept the command line, else the piece of the one error line a bad-input row must give if its
    case is refused while parsing. tests/test_faults.py checks them with each script's parser."""
    camp = Campaign(workdir, quick=False, only=None)
    ws = os.path.join(camp.workdir, 'runs', 'ws')
    accepted = [('digits', argv) for argv in digits_commands(os.path.join(camp.workdir, 'digits'))]
    accepted += [(f'the {workers}-worker training run', runner_argv(ws, workers)) for workers in (1, 2)]
    accepted += [('damaged-state', from_previous_state(ws))]
    accepted += [(f'write-failure/{name}', argv) for name, argv, *_ in write_failure_cases(camp)]
    accepted += soak_commands(camp, soak_epochs)
    return [(name, argv, None) for name, argv in accepted] + bad_input_commands(camp)


def parse_args(argv=None):
    """The campaign's options, --starts and --soak-epochs given their defaults (which follow --quick)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workdir', default='/tmp/fault_campaign', help='datasets, baselines and runs (cached)')
    parser.add_argument('--quick', action='store_true', help='a subset of every class of fault')
    parser.add_argument('--only', help='regular expression: run the rows whose "class/fault" name matches')
    parser.add_argument('-o', '--output', help='write the rows as JSON to this file')
    parser.add_argument('--starts', type=int, default=None,
                        help='start-up class: starts of the 2-worker run (default 10, 3 with --quick)')
    parser.add_argument('--soak-epochs', type=int, default=None,
                        help='soak class: epochs per backend and of the training run (default 20, 4 with --quick)')
    parser.add_argument('--inspect', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.starts = args.starts if args.starts is not None else 3 if args.quick else 10
    args.soak_epochs = args.soak_epochs or (4 if args.quick else 20)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.inspect:
        inspect(args.inspect)
        return 0
    camp = Campaign(args.workdir, args.quick, args.only, args.starts)
    start = time.time()
    camp.digits()
    for step, *more in ((kill_chain, 1), (kill_chain, 2), (signal_chain, 1), (signal_chain, 2), (worker_lost,),
                        (repeated_starts,), (damaged_state,), (write_failures,), (bad_input_campaign,),
                        (soak_campaign, args.soak_epochs)):
        try:
            step(camp, *more)
        except Exception as e:     # a failure of the campaign itself is a BAD row, and the others still run
            camp.row(f'campaign/{step.__name__}{more or ""}', 'no failure of the campaign',
                     f'{type(e).__name__}: {e}', False, 0)
    minutes = (time.time() - start) / 60
    print('\n| fault | expected | observed | verdict |\n|---|---|---|---|')
    for r in camp.rows:
        print(f'| {r["fault"]} | {r["expected"]} | {r["observed"]} | {r["verdict"]} |')
    print(f'\n{summary(camp.rows)}\n\n{len(camp.rows)} rows in {minutes:.1f} min')
    if args.output:
        with open(args.output, 'w') as f:
            json.dump({'command': sys.argv, 'minutes': round(minutes, 1), 'rows': camp.rows}, f, indent=2)
    return 1 if any(r['verdict'] == 'BAD' for r in camp.rows) else 0


if __name__ == '__main__':
    sys.exit(main())
