"""Shared test set-up: the repository on sys.path, MXNet kept to this machine's cores (shared by the test
processes under pytest-xdist), every test in one tier (pytest.ini: unit, integration, multiworker), small real
datasets and trained workspaces built once per run with the recipe's own tools (the digits demo set, a
ResNet-10 trained on it), and train.py's and the runner's main in process for every run that needs no process of
its own (run_mode, runner_runs)."""
import contextlib
import functools
import json
import io
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def threads_per_process():
    """OpenMP threads per test process: the cores shared by pytest-xdist's workers, which run at once (MXNet's
    small networks here run several times slower with more threads than cores)."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT') or 1)
    return str(max(1, (os.cpu_count() or 1) // workers))


# The user's OMP_NUM_THREADS wins; the default is marked as the tests' own, so that xdist's workers (which inherit
# the controller's environment) set theirs.
if 'OMP_NUM_THREADS' not in os.environ or os.environ.get('RN50_TESTS_OMP') == os.environ['OMP_NUM_THREADS']:
    os.environ['OMP_NUM_THREADS'] = os.environ['RN50_TESTS_OMP'] = threads_per_process()

# MXNet loaded as train.py and the runner load it (rn50/world/cpu.py's load_mxnet), before any test module imports
# it: the runs in process (run_mode, runner_runs) meet the MXNet the programs meet.
from rn50.world import cpu  # noqa: E402
cpu.load_mxnet()


def run_script(*argv, check=True, **kwargs):
    """Run a repository script with this interpreter; returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable] + [str(a) for a in argv], cwd=ROOT, capture_output=True, text=True,
                          check=check, **kwargs)


def run_train_py(*argv, check=True):
    """train.py with this interpreter; with `check`, an AssertionError with the end of its stderr when it fails."""
    return checked(run_script(os.path.join(ROOT, 'train.py'), *argv, check=False), check)


def checked(result, check):
    """`result` of a train.py run; with `check`, an AssertionError with the end of its stderr when it failed."""
    if check and result.returncode != 0:
        raise AssertionError(f'train.py failed ({result.returncode}):\n{result.stderr[-3000:]}')
    return result


def run_mode(*argv, check=True):
    """train.py as run_train_py runs it, but in this process (train_main): no interpreter's start-up, MXNet's
    import and first allocations for each of the suite's many short runs. Two kinds of run change the process
    for good and stay programs: training with --amp (mxnet.contrib.amp.init patches MXNet's operators for the
    rest of the process) and Horovod's (--kv-store horovod: one world per process)."""
    argv = [str(a) for a in argv]

    def last(flag, default):
        values = [argv[i + 1] for i, given in enumerate(argv[:-1]) if given == flag]
        return values[-1] if values else default
    trains = last('--mode', 'train_val') in ('train', 'train_val')
    if (trains and '--amp' in argv) or last('--kv-store', 'device') == 'horovod':
        return run_train_py(*argv, check=check)
    return checked(train_main(*argv), check)


@contextlib.contextmanager
def process_state_kept():
    """What a run of train.main or the runner's main changes in this process, put back after: the root logger's
    handlers and level (logs.setup_logging replaces them, with a file handler in the workspace), the signal
    handlers (StopRequest catches SIGTERM, SIGUSR1 and SIGINT), the environment and the working directory."""
    import logging
    import signal
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    signals = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    environ, cwd = dict(os.environ), os.getcwd()
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        for number, handler in signals.items():
            signal.signal(number, handler)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)


def in_process(main, *argv):
    """`main(argv)` (train.main, the runner's main) in this process, for runs that do not train (a user error:
    `error: ...`, exit status 2; train.py's val, pred and export): a CompletedProcess with its exit status and the
    output Python writes, as run_train_py's, without a new interpreter's start-up (MXNet's import alone takes
    seconds). Messages MXNet's or DALI's C++ code prints go to the real stderr, not into it."""
    argv = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with process_state_kept(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:          # argparse's errors and --help
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def train_main(*argv):
    """train.py's main(argv) in this process (see in_process): for flags refused before any training, and for the
    modes that do not train (val, pred, export)."""
    import train
    return in_process(train.main, *argv)


def runner_in_process(argv, run_here, cwd=None):
    """The runner's main(argv) in this process (see in_process), in `cwd` when given, with `run_here(command)`
    standing in for the runner's own run of train.py's main (a one-worker run: runner.run_here); a horovodrun
    launch (Supervisor) fails the test."""
    from unittest import mock
    runner = runner_module()

    def launched(*args, **kwargs):
        raise AssertionError(f'the runner launched {args[:1]} with horovodrun: run it as a program')

    def main(argv):
        if cwd is not None:
            os.chdir(cwd)            # process_state_kept goes back
        return runner.main(argv)
    with mock.patch.object(runner, 'run_here', run_here), mock.patch.object(runner, 'Supervisor', launched):
        return in_process(main, *argv)


def runner_main(*argv):
    """The runner's main(argv) in this process, for a command refused before launch: a launch fails the test
    instead of replacing or outliving this process."""
    def launched(command):
        raise AssertionError(f'the runner launched {command[:2]} instead of refusing the command')
    return runner_in_process(argv, launched)


def runner_runs(*argv, cwd=None):
    """The runner's main(argv) in this process for a one-worker run, in `cwd` when given: the train.py run it
    makes in its own process (run_here) runs as a program instead, with the command and environment the runner
    gives it (a Horovod world of one, which belongs to a process of its own). A CompletedProcess with train.py's
    exit status and the runner's output followed by train.py's."""
    started = []

    def train_as_a_program(command):
        assert command[1] == runner_module().TRAIN_PY, command
        started.append(subprocess.run(command, env=dict(os.environ), capture_output=True, text=True))
        return started[-1].returncode
    result = runner_in_process(argv, train_as_a_program, cwd)
    if not started:
        return result
    return subprocess.CompletedProcess(result.args, started[0].returncode, result.stdout + started[0].stdout,
                                       result.stderr + started[0].stderr)


def two_gloo_workers(*command):
    """`horovodrun -np 2 --gloo COMMAND` as the runner starts it: rn50/launch/horovodrun.py, horovodrun without
    the MXNet import of its build check (2.5 s of a core a launch)."""
    from rn50.launch.supervisor import started
    return started(['horovodrun', '-np', '2', '--gloo', *map(str, command)])


def gloo_workers(script, output, **environ):
    """Run tests/`script` OUTPUT as 2 Horovod workers over Gloo (1 OpenMP thread each, `environ` added); returns
    the JSON that rank 0 wrote to `output`."""
    import json
    result = subprocess.run(two_gloo_workers(sys.executable, os.path.join(ROOT, 'tests', script), output),
                            capture_output=True, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS='1', **environ), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(output) as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def runner_module():
    """The `runner` script as a module (it has no .py suffix), loaded once: its functions and main() in process."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader('runner', os.path.join(ROOT, 'runner'))
    spec = importlib.util.spec_from_loader('runner', loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def report_gpus(monkeypatch, gpus, fused=True):
    """The CUDA driver and MXNet made to report `gpus` GPUs (and, with `fused`, NVIDIA's fused batchnorm kernels,
    as its build in the container does): the runner's own code plans for them, from machine_gpus() to layers.py's
    probe."""
    import mxnet as mx
    from rn50.nets import layers
    from rn50.world import cuda_driver
    monkeypatch.setattr(cuda_driver, 'gpu_count', lambda: gpus)
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: gpus)
    if fused:
        monkeypatch.setattr(layers, 'fused_ops_available', lambda: {'nvidia_bn_relu': True,
                                                                    'nvidia_bn_add_relu': True,
                                                                    'onednn_bn_relu': False})


def horovod_says(expression, imports=''):
    """The JSON value of `expression`, computed in a process of its own with `hvd` (horovod.mxnet) imported after
    MXNet and `imports`: a test process must not import horovod.mxnet. Imported without hvd.init(), as only tests
    do (the recipe imports it to start Horovod), it leaves the process's next DALI pipeline to abort ('free():
    invalid size', DALI 1.34, Horovod 0.28.1): a later test of the same pytest-xdist worker crashed."""
    script = (f'import json, sys\nsys.path.insert(0, {ROOT!r})\nfrom rn50.world import cpu\ncpu.load_mxnet()\n'
              f'import horovod.mxnet as hvd\n{imports}\nprint(json.dumps({expression}))\n')
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def modules_imported(stderr):
    """The module names that a program's `-X importtime` output (its `stderr`) lists."""
    return {line.split('|')[-1].strip() for line in stderr.splitlines() if line.startswith('import time:')}


def deferred_by_mxnet(imported):
    """The names among `imported` (modules_imported) that show a module of cpu.DEFERRED_BY_MXNET as loaded. A
    refused import is listed too, by the name it asked for (sklearn.base, scipy.stats): a package that loaded shows
    by its own name (sklearn), a module of a package by a module inside it (scipy.stats.*, scipy.sparse.*)."""
    return {name for name in imported for deferred in cpu.DEFERRED_BY_MXNET
            if (name.startswith(deferred + '.') if '.' in deferred else name == deferred)}


def allocated(net):
    """`net` with every parameter allocated as zeros, nothing drawn: for a test that sets each array next, or reads
    only their shapes. The recipe's He-normal draws cost a second of CPU for a ResNet-50's 25 million weights
    (MXNet's normal sampler), a third of the unit tier's time when every test drew them."""
    import mxnet as mx
    for param in net.collect_params().values():
        param.initialize(init=mx.init.Zero())     # the parameter's own initializer, He-normal, is not used
    return net


def random_weights(net, seed=0):
    """`net` initialised for a test that compares two computations of the same weights: every weight uniform with
    the variance of the recipe's He-normal (MXNet draws uniform numbers four times faster than normal ones: 0.2
    against 0.8 s of CPU for a ResNet-50), every other parameter by its own initializer, then randomise_batchnorm."""
    import mxnet as mx
    mx.random.seed(seed)
    he_uniform = mx.init.Xavier(rnd_type='uniform', factor_type='in', magnitude=6)   # variance 2 / fan-in
    for param in net.collect_params().values():
        param.initialize(init=he_uniform if param.name.endswith('weight') else None)
    randomise_batchnorm(net, seed)
    return net


def randomise_batchnorm(net, seed=0):
    """Non-trivial batchnorm parameters and statistics (zero gammas would hide most of the network)."""
    import mxnet as mx
    import numpy as np
    rng = np.random.RandomState(seed)
    for name, param in net._collect_params_with_prefix().items():
        low, high = {'gamma': (0.5, 1.5), 'beta': (-0.5, 0.5), 'running_mean': (-0.5, 0.5),
                     'running_var': (0.5, 1.5)}.get(name.rsplit('.', 1)[1], (None, None))
        if low is not None:
            param.set_data(mx.nd.array(rng.uniform(low, high, param.shape)))


def in_fresh_process(test):
    """Run `test` alone in a new interpreter. MXNet 1.9.1's oneDNN crashes (segmentation fault) in an NHWC
    batchnorm when other networks ran before it in the process (seen on an AVX-512 Xeon, test order dependent;
    alone it passes), so such a test must not share the suite's process."""
    @functools.wraps(test)
    def isolated(*args, **kwargs):
        if os.environ.get('RN50_FRESH_PROCESS'):
            return test(*args, **kwargs)
        node = os.environ['PYTEST_CURRENT_TEST'].rsplit(' ', 1)[0]
        result = subprocess.run([sys.executable, '-m', 'pytest', node, '-q', '-p', 'no:cacheprovider'], cwd=ROOT,
                                capture_output=True, text=True, env=dict(os.environ, RN50_FRESH_PROCESS='1'))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return isolated


def built_once(tmp_path_factory, name, build):
    """The folder `name`, which `build(folder)` fills once for the whole run: pytest-xdist's workers share it (the
    first to ask builds it while the others wait), so a dataset or a trained workspace costs one build however the
    tests are spread. Tests only read it; one that writes works on a copy (copy_workspace)."""
    import fcntl
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent               # the run's folder, above each worker's own
    folder, done = root / name, root / f'{name}.done'
    with open(root / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)             # released as the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)     # what a build that failed in another worker left
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def copy_workspace(source, destination):
    """A copy of a shared workspace for a test that writes to it: a mode run in a workspace appends to its logs
    and writes its reports, an INT8 model or an export beside the weights."""
    shutil.copytree(source, destination)
    return destination


@pytest.fixture(scope='session')
def digits(tmp_path_factory):
    """The demo dataset: digits as 32x32 JPEGs (images/) converted to RecordIO (rec/)."""
    def build(root):
        run_script('scripts/make_demo_dataset.py', root / 'images')
        run_script('scripts/prepare_dataset.py', root / 'images', root / 'rec', '--names',
                   root / 'images' / 'names.txt', '--workers', '2')
    return built_once(tmp_path_factory, 'digits', build)


# The ResNet-10 of trained_digits, after digits_flags(digits, batch=32): the flags a test gives to use its weights
# (trained at 24x24 after a 28 resize: the resize shrinks the 32x32 digits, as tests/test_preprocessing.py needs),
# and those of its training run.
TRAINED_NET = ['--num-layers', '10', '--seed', '4', '--data-backend', 'mxnet', '--image-shape', '3,24,24',
               '--data-val-resize', '28']
TRAINED_RUN = ['--num-epochs', '3', '--lr', '0.2', '--warmup-epochs', '1', '--min-random-area', '0.5', '--mode',
               'train_val']


@pytest.fixture(scope='session')
def trained_digits(digits, tmp_path_factory):
    """The workspace of a ResNet-10 trained 3 epochs on the digits with --data-backend mxnet (TRAINED_NET; about
    88% top-1), trained once for the whole run and shared by every test that needs trained weights: read it, or
    copy_workspace it to run a mode in it."""
    return built_once(tmp_path_factory, 'trained_digits', lambda workspace: run_mode(
        *digits_flags(digits, batch=32), *TRAINED_NET, *TRAINED_RUN, '--workspace', workspace))


# trained_apart's run, after its data flags (apart_data_flags): trained at 32x32, tested at 40x40 after a 46 resize.
APART = ['--seed', '3', '--batch-size', '32', '--data-backend', 'mxnet', '--data-mxnet-threads', '2',
         '--num-layers', '10', '--image-shape', '3,32,32', '--val-image-shape', '3,40,40', '--data-val-resize', '46',
         '--num-epochs', '1', '--num-examples', '64', '--warmup-epochs', '0']


def apart_data_flags(digits):
    rec = digits / 'rec'
    return ['--data-train', rec / 'train.rec', '--data-train-idx', rec / 'train.idx', '--data-val', rec / 'val.rec',
            '--data-val-idx', rec / 'val.idx']


@pytest.fixture(scope='session')
def trained_apart(digits, tmp_path_factory):
    """The workspace of a ResNet-10 trained 1 epoch (64 images) at 32x32 and tested at 40x40 after a 46 resize
    (APART; the digits are 32x32 JPEGs), trained once for the whole run: read it, or copy_workspace it."""
    return built_once(tmp_path_factory, 'trained_apart',
                      lambda workspace: run_mode(*apart_data_flags(digits), *APART, '--workspace', workspace))


def train_args(extra=()):
    """train.py flags as the command line alone settles them (resolve.from_command: not yet for a run)."""
    import train
    return train.parse_flags(list(extra))[0]


def digits_flags(digits, batch=16):
    rec = digits / 'rec'
    return ['--data-train', str(rec / 'train.rec'), '--data-train-idx', str(rec / 'train.idx'),
            '--data-val', str(rec / 'val.rec'), '--data-val-idx', str(rec / 'val.idx'),
            '--num-classes', '10', '--image-shape', '3,32,32', '--data-val-resize', '32',
            '--batch-size', str(batch), '--data-mxnet-threads', '2', '--dali-threads', '2',
            '--dali-validation-threads', '2', '--dali-prefetch-queue', '2']


def resolved(flags, **values):
    """train.py flags resolved for a run on this machine (CPU), as train.py resolves them (read-only); `values`
    replace some after. --dtype float16, which a CPU run refuses, stays: the CPU twin of a GPU run's float16
    machinery on CPU operators."""
    import train
    from rn50.config import resolve
    args, origin = train.parse_flags(list(flags))
    if args.dtype == 'float16':
        args.dtype = None
        values = dict({'dtype': 'float16'}, **values)
    args = resolve.for_run(args, origin, on_gpu=False)[0]
    return resolve.with_values(args, **values) if values else args


def exported(args, world=None):
    """export.export of the resolved flags `args` (--mode export), its records made as train.py makes them."""
    import dali
    import models
    import train
    from rn50.checkpoints.workspace import Workspace
    from rn50.data import contract
    from rn50.inference import export
    from rn50.nets.network import Network
    from rn50.world import workers
    return export.export(export.Export.of(args), Network.of(args), workers.World() if world is None else world,
                         Workspace.of(args), contract.Dataset.of(args), train.Loaders.of(args),
                         functools.partial(models.build, device='cpu'),
                         functools.partial(dali.serialize_preprocessing, contract.Images.of(args),
                                           args.dali_validation_threads))


def scalars(folder):
    """The scalars of the TensorBoard event files in `folder` (--tensorboard), read with TensorBoard's own reader:
    {tag: [(step, value rounded to 5 places)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, round(e.value, 5)) for e in events.Scalars(tag)] for tag in events.Tags()['scalars']}


# ---- tiers ----------------------------------------------------------------------------------------------------

TIERS = ('multiworker', 'integration', 'unit')     # pytest.ini says what each means; the costliest first
# Fixtures that train once for the whole run (built_once; run, continued and one_epoch are test_preprocessing's,
# test_short_runs' and test_train's): under pytest-xdist the tests of each run on one worker, the one that trains it.
SHARED_BUILDS = ('trained_digits', 'trained_apart', 'run', 'continued', 'one_epoch')


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test file with a test of no tier, or of several, or a unit test that reads a shared training run (the
    unit tier trains nothing beyond a few steps), fails to collect: an error naming the tests, whatever -m
    selects, with pytest-xdist too."""
    report = yield
    if not report.passed:
        return report
    wrong = []
    for item in report.result:
        if not isinstance(item, pytest.Item):
            continue
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        trained = sorted(set(SHARED_BUILDS) & set(getattr(item, 'fixturenames', ())))
        if len(tiers) != 1:
            wrong.append(f'{item.nodeid}: {", ".join(tiers) or "no tier"}')
        elif tiers == ['unit'] and trained:
            wrong.append(f'{item.nodeid}: unit, but reads {", ".join(trained)} (a training run): integration')
    if wrong:
        report.outcome, report.result = 'failed', []
        report.longrepr = ('every test needs exactly one tier marker, unit, integration or multiworker (see '
                           'pytest.ini), and a unit test trains nothing; these do not:\n  ' + '\n  '.join(wrong))
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (--dist loadgroup) the multi-worker tests run one after the other on one worker, the
    tests of a trained workspace on the worker that trains it, and the tiers go out costliest first, so that the
    unit tier's seconds fill the end of the run instead of a long run starting last."""
    for item in items:
        if item.get_closest_marker('multiworker'):      # one at a time (Horovod's collectives spin), first
            item.add_marker(pytest.mark.xdist_group('multiworker'))
            continue
        shared = next((name for name in SHARED_BUILDS if name in item.fixturenames), None)
        if shared:          # on the worker that builds it, instead of another waiting for the build
            item.add_marker(pytest.mark.xdist_group(shared))
    if hasattr(config, 'workerinput'):
        items.sort(key=lambda item: next(TIERS.index(mark.name) for mark in item.iter_markers() if mark.name in TIERS))
