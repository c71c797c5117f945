"""Shared test set-up: the repository on sys.path, MXNet kept to this machine's cores, and small real
datasets built once per session with the recipe's own tools (the digits demo set, and a JPEG tree)."""
import functools
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('OMP_NUM_THREADS', str(os.cpu_count() or 1))


def run_script(*argv, check=True, **kwargs):
    """Run a repository script with this interpreter; returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable] + [str(a) for a in argv], cwd=ROOT, capture_output=True, text=True,
                          check=check, **kwargs)


def run_train_py(*argv, check=True):
    """train.py with this interpreter; with `check`, an AssertionError with the end of its stderr when it fails."""
    result = run_script(os.path.join(ROOT, 'train.py'), *argv, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f'train.py failed ({result.returncode}):\n{result.stderr[-3000:]}')
    return result


def gloo_workers(script, output):
    """Run tests/`script` OUTPUT as 2 Horovod workers over Gloo (1 OpenMP thread each); returns the JSON
    that rank 0 wrote to `output`."""
    import json
    result = subprocess.run(['horovodrun', '-np', '2', '--gloo', sys.executable, os.path.join(ROOT, 'tests', script),
                             str(output)], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS='1'),
                            timeout=300)
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
    """MXNet made to report `gpus` GPUs (and, with `fused`, NVIDIA's fused batchnorm kernels, as its build in
    the container does): the runner's own code plans for them, from machine_gpus() to layers.py's probe."""
    import mxnet as mx
    from rn50.nets import layers
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: gpus)
    if fused:
        monkeypatch.setattr(layers, 'fused_ops_available', lambda: {'nvidia_bn_relu': True,
                                                                    'nvidia_bn_add_relu': True,
                                                                    'onednn_bn_relu': False})


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


@pytest.fixture(scope='session')
def digits(tmp_path_factory):
    """The demo dataset: digits as 32x32 JPEGs (images/) converted to RecordIO (rec/)."""
    root = tmp_path_factory.mktemp('digits')
    run_script('scripts/make_demo_dataset.py', root / 'images')
    run_script('scripts/prepare_dataset.py', root / 'images', root / 'rec', '--names',
               root / 'images' / 'names.txt', '--workers', '2')
    return root


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
    return resolve.replaced(args, **values) if values else args
