"""Run logs: the DLLogger-compatible JSON-lines file, the human log and report.json.

Three outputs, all written by rank 0 only:

* `--dllogger-log` (default `dllogger_log.log` in the workspace): one record per line, `DLLL ` followed by a
  JSON object, in the format of NVIDIA's DLLogger 0.1.0 JSON-stream backend, so existing parsers (and
  `benchmark.py`) keep working. Records have `timestamp`, `datetime`, `elapsedtime`, `type` ("LOG" or
  "METADATA") and either `step` + `data` or `metric` + `metadata`. Steps are "PARAMETER", [epoch, iteration],
  [epoch] and [] (the summary). The same records are echoed on stdout as `DLL <datetime> - <step> name : value
  unit ...`. Unlike the original the file is appended to, so a resumed run keeps the earlier records.
* `--log` (default `log.log` in the workspace): the human-readable Python log, also shown on stderr.
* `report.json` in the workspace: per-epoch metrics, the resolved configuration, library versions, hardware and
  total duration; rewritten atomically after every epoch so a crash never leaves half a file.

Every output is written atomically (rn50/files.py's `atomic_path`, the one way the recipe writes a file,
checkpoints included); where in the workspace an output goes is rn50/checkpoints/workspace.py's
(`Workspace.place`, `Workspace.report`).

Usage (see train.py and fit.py): `logger = DLLogger(path)`, `logger.log(step, {...})`,
`write_report(workspace.report(args.mode), vars(args), world, history, summary)`,
`progress_bar(total, label, enabled)`.
"""
import datetime
import json
import logging
import os
import platform
import resource
import sys
import time

import tqdm

from rn50 import files
from rn50.errors import RecipeError
from rn50.world import cpu

# Units of the metrics the recipe logs, declared once as METADATA records at the start of the file.
METRIC_UNITS = {
    'train.loss': None,
    'train.lr': None,
    'train.ips': 'images/s',
    'val.loss': None,
    'val.accuracy': None,
    'val.top_k_accuracy_5': None,
    'val.ema.loss': None,
    'val.ema.accuracy': None,
    'val.ema.top_k_accuracy_5': None,
    'val.ips': 'images/s',
    'val.latency_avg': 's',
    'val.latency_50': 's',
    'val.latency_90': 's',
    'val.latency_95': 's',
    'val.latency_99': 's',
    'val.latency_100': 's',
}


def duration_text(seconds):
    """1 h 05 min, 4 min 10 s, 12 s: an ETA a person reads at a glance."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f'{seconds // 3600} h {seconds % 3600 // 60:02d} min'
    return f'{seconds // 60} min {seconds % 60:02d} s' if seconds >= 60 else f'{seconds} s'


def step_text(step):
    """How a step reads on stdout: PARAMETER, Epoch: E Iteration: I, Epoch: E, or Summary:."""
    if isinstance(step, str):
        return step
    if len(step) == 0:
        return 'Summary:'
    if len(step) == 1:
        return f'Epoch: {step[0]}'
    return f'Epoch: {step[0]} Iteration: {step[1]}'


def format_value(value):
    if isinstance(value, float):
        return f'{value:.5g}'
    return str(value)


class DLLogger:
    """Writes DLLogger JSON-lines records to a file (None: no file) and echoes them on stdout (or `stream`)."""

    def __init__(self, path=None, echo=True, stream=None):
        self.start = time.time()
        self.stream = stream
        self.echo = echo
        self.file = None
        # Whether the file already holds records of an earlier run (this one appends to them).
        self.appending = path is not None and os.path.exists(path) and os.path.getsize(path) > 0
        if path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.file = open(path, 'a', buffering=1)
            for metric, unit in METRIC_UNITS.items():
                self._write({'type': 'METADATA', 'metric': metric, 'metadata': {'unit': unit}})

    def _write(self, record):
        now = time.time()
        stamped = {'timestamp': str(now),
                   'datetime': datetime.datetime.fromtimestamp(now).strftime('%Y-%m-%d %H:%M:%S.%f'),
                   'elapsedtime': str(now - self.start)}
        stamped.update(files.finite_or_none(record))
        if self.file is not None:
            try:
                self.file.write('DLLL ' + json.dumps(stamped, allow_nan=False) + '\n')
            except OSError as e:
                raise RecipeError(f'could not write the DLLogger file {self.file.name}: {e.strerror or e}') from e

    def log(self, step, data, note=''):
        """One LOG record; `step` is "PARAMETER", a list of ints, or [] for the summary. `note` is added to
        the echoed line only (e.g. the epoch's total and ETA), never to the file's record."""
        step = step if isinstance(step, str) else list(step)
        self._write({'type': 'LOG', 'step': step, 'data': data})
        if self.echo:
            fields = ' '.join(f'{name} : {format_value(value)}' + (f' {METRIC_UNITS[name]}'
                                                                 if METRIC_UNITS.get(name) else '')
                              for name, value in data.items())
            now = datetime.datetime.now().strftime('%Y-%m-%dT%H:%M:%S.%f')
            write_line(f'DLL {now} - {step_text(step)} {fields}' + (f' ({note})' if note else ''),
                       self.stream or sys.stdout)

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None


# The keys of a record that are times, not results (speed, latency, the gap between epochs): they differ between
# two runs that train alike.
TIMINGS = ('ips', 'latency_avg', 'epoch_gap')


def without_timings(data):
    """A DLLogger record's data without its TIMINGS: what a rerun or a resumed run must reproduce."""
    return {key: value for key, value in data.items() if not key.endswith(TIMINGS)}


def read_dllogger(path):
    """The LOG records of a DLLogger file, as dicts (METADATA records and other lines are skipped).

    A resumed run appends a 'RESUME' record naming the epoch and iteration it continues from (so does a run
    that starts afresh in a workspace whose file holds records, e.g. after a run killed before its first
    state); the records the interrupted run logged past that point (it ran on after its last checkpoint) are
    superseded by the resumed run's and left out here, so every step appears once."""
    records = []
    with open(path) as f:
        for line in f:
            if line.startswith('DLLL '):
                record = json.loads(line[5:])
                if record.get('type') != 'LOG':
                    continue
                if record['step'] == 'RESUME':
                    position = (record['data']['epoch'], record['data']['iteration'])
                    records = [r for r in records if not logged_after(r['step'], position)]
                records.append(record)
    return records


def logged_after(step, position):
    """Whether a record of `step` belongs past (epoch, iteration) `position` of training."""
    if isinstance(step, str):
        return False
    if len(step) == 0:
        return True
    epoch, iteration = position
    if len(step) == 1:
        return step[0] >= epoch
    return (step[0], step[1]) > (epoch, iteration)


def write_line(text, stream):
    """One line on `stream`, written around an open progress bar (the bar is cleared and drawn again below
    it) instead of onto the bar's line: on a terminal stdout and stderr are the same screen."""
    tqdm.tqdm.write(text, file=stream)
    stream.flush()


class BarSafeHandler(logging.StreamHandler):
    """The human log on stderr, written with write_line: to the sys.stderr of the moment, as logging's own
    last-resort handler does, not the one there was when logging was set up (a caller that replaced and closed
    it, as a test capturing the output of train.main in process, would make every later line a logging error)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):    # StreamHandler.__init__ sets it; the property above decides
        pass

    def emit(self, record):
        try:
            write_line(self.format(record), self.stream)
        except Exception:  # logging's own rule: a failed log line never stops the program
            self.handleError(record)


def setup_logging(log_path=None, rank=0):
    """Human log: INFO on stderr and in `log_path` for rank 0; other ranks only print warnings and errors."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    level = logging.INFO if rank == 0 else logging.WARNING
    formatter = logging.Formatter('%(asctime)s:%(levelname)s: %(message)s' if rank == 0 else
                                  f'%(asctime)s:%(levelname)s: [rank {rank}] %(message)s')
    handlers = [BarSafeHandler()]
    if log_path is not None and rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode='a'))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)


def library_versions(all_known=False):
    """Versions of the libraries that decide speed and numerics: those this process loaded, or with
    `all_known` every one that is installed."""
    versions = {'python': platform.python_version()}
    for name, module in (('mxnet', 'mxnet'), ('numpy', 'numpy'), ('dali', 'nvidia.dali'),
                         ('horovod', 'horovod')):
        if all_known or module in sys.modules or name in ('mxnet', 'numpy'):
            try:
                versions[name] = __import__(module, fromlist=['__version__']).__version__
            except ImportError:
                pass
    return versions


def hardware():
    """CPU model and count, memory and GPU names: what a throughput number needs next to it."""
    import mxnet as mx      # here, not above: benchmark.py and the scripts read logs without loading MXNet
    info = {'cpu': cpu.identity() if cpu.cpuinfo_field('model name') else platform.processor() or platform.machine(),
            'cpu_count': os.cpu_count(), 'gpus': mx.context.num_gpus()}
    try:
        import psutil
        info['memory_gb'] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return info


def peak_memory_mb():
    """Peak resident memory of this program, in MB (host memory; GPU memory is reported by nvidia-smi): Linux's
    VmHWM, which starts afresh when the program starts. getrusage's ru_maxrss is only the fallback: it keeps
    the peak of the process before its exec, so a train.py that a 7 GB benchmark or test process started
    reported 7 GB for a 3.8 GB run."""
    try:
        with open('/proc/self/status') as status:
            for line in status:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_report(path, config, world, history, summary=None, duration=None, seed=None, review=None):
    """The mode's report, `path` (Workspace.report: report.json, or report_<mode>.json), written by rank 0 only:
    the resolved configuration (`config`: {flag destination: value}, the resolved flags' vars), the run's seed
    (given or drawn), the world's workers and devices, AMP's dtype, versions, hardware, per-epoch metrics, the
    summary, the duration so far (`duration`: training's, over all its resumes; else this process's) and the
    `review` of what the model learned (rn50/review/; docs/runs.md lists its keys)."""
    if world.rank != 0:
        return
    report = {'model': config['arch'], 'mode': config['mode'], 'workers': world.size, 'seed': seed,
              'devices': [str(c) for c in world.devices.contexts], 'amp_dtype': world.devices.amp_dtype,
              'cmd': sys.argv, 'config': config,
              'versions': library_versions(), 'hardware': hardware(), 'epochs': history,
              'total_duration': time.time() - world.start_time if duration is None else duration,
              'peak_memory_mb': peak_memory_mb()}
    if summary is not None:
        report['summary'] = summary
    if review is not None:
        report['review'] = review
    files.write_json(path, report)


# ----------------------------------------------------------------------------------------------------------
# Timing and progress


def steady_durations(durations):
    """Drop each epoch's warm-up iterations (min(10%, 100), and at least the first, which includes graph
    building) before averaging."""
    if len(durations) <= 1:
        return durations
    return durations[max(1, min(len(durations) // 10, 100)):]


def progress_bar(total, label, enabled):
    """A tqdm bar with images/s and ETA on stderr when `enabled` and stderr is a terminal; a silent one
    otherwise (the periodic DLLogger lines serve as progress in log files)."""
    return tqdm.tqdm(total=total, desc=label, unit='batch', dynamic_ncols=True, leave=False,
                     disable=not (enabled and sys.stderr.isatty()))
