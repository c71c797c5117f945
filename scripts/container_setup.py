"""NVIDIA's MXNet container as the Dockerfile builds it: the pip constraints the image's own packages impose,
and the build's check that everything the recipe imports loads.

    python container_setup.py constraints > /tmp/container.txt   # the image's numpy; protobuf as below
    python scripts/container_setup.py check   # the packages, DALI's automatic augmentation, Horovod's MXNet API

`constraints` keeps the image's numpy (its MXNet is built against it), and refuses, in one `error:` line, an
image whose numpy is older than 1.20.3, the oldest the pins install with (pandas 2.0.3, which mlperf-logging needs,
on Python 3.8). It keeps the image's protobuf when that is 3.20.2 or newer; an older protobuf 3.x may be raised
within 3.x (`protobuf>=3.20.2,<4`, which pip resolves to 3.20.3): onnx 1.14.1 and tensorboardX 2.6.2.2 need
3.20.2, and a 3.x runtime runs the code every 3.x protoc generated, so nothing the image ships stops working.
The pins of requirements-container.txt install on any protobuf 3.x or 4.x the image may have.

`check` loads MXNet as every worker does (cpu.load_mxnet), so the image keeps MXNet's operators compiled in root's
~/.cache/rn50 (rn50/world/operator_cache.py). A docker build runs without NVIDIA's runtime, so without the CUDA
driver library (libcuda.so.1), which NVIDIA's libmxnet.so links (for its run-time compilation of CUDA kernels):
there, importing MXNet, and Horovod's MXNet module with it, fails with "libcuda.so.1: cannot open shared object
file" (apache/mxnet#18960). When the driver library does not load, `check` runs itself again with CUDA's stub
library (the toolkit's stubs/libcuda.so, linked as libcuda.so.1 in a folder of its own first on LD_LIBRARY_PATH), as
Horovod's own images build against MXNet: enough to load the libraries and read their APIs, never to run on a GPU.
Every worker checks Horovod's API again when it starts, with the real driver (rn50/world/workers.py). Without a
driver and without a stub (CUDA_STUBS_DIR names another folder) an MXNet that needs one is one `error:` line.

Standard library only until `check` imports the recipe; Python 3.8 (the container's).
"""
import atexit
import ctypes
import glob
import importlib
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile

import bootstrap

bootstrap.on_path()   # rn50/ importable for `check` (`constraints` runs before the Dockerfile copies it)

# What requirements-container.txt installs, by import name (the Dockerfile's build imports each).
PACKAGES = ('tqdm', 'safetensors.numpy', 'PIL', 'psutil', 'sklearn', 'matplotlib', 'onnx', 'onnxruntime',
            'tensorboardX', 'mlperf_logging.mllog')
# The lowest protobuf the pins of requirements-container.txt accept (onnx 1.14.1: >=3.20.2; tensorboardX 2.6.2.2:
# >=3.20); tests/test_container.py reads their metadata to keep this true.
PROTOBUF_FLOOR = (3, 20, 2)
# The oldest numpy requirements-container.txt installs with: pandas 2.0.3's on Python 3.8 (scipy 1.10.1 needs 1.19.5);
# tests/test_container.py reads pandas' metadata in the container's twin, .venv-3.8.
NUMPY_FLOOR = (1, 20, 3)
DRIVER = 'libcuda.so.1'
# Where CUDA's toolkit keeps its stub of the driver library (NVIDIA's images: /usr/local/cuda -> cuda-11.x).
STUB_FOLDERS = ('/usr/local/cuda/lib64/stubs', '/usr/local/cuda/targets/x86_64-linux/lib/stubs',
                '/usr/local/cuda/targets/sbsa-linux/lib/stubs')
STUBS_IN_USE = 'RN50_CUDA_STUBS_IN_USE'   # set in the run with the stub: the folder to remove at its exit


def version_tuple(text):
    """(3, 20, 3) of '3.20.3'; the leading numbers only ('4.21.0rc1' -> (4, 21, 0))."""
    return tuple(int(part) for part in re.findall(r'\d+', text.split('+')[0])[:3])


class Unsupported(Exception):
    """An image the pins cannot install on."""


def constraints(installed):
    """The pip constraint lines of the image's own packages; `installed`: {distribution name, lower case:
    version}. Unsupported when the image's numpy is older than NUMPY_FLOOR."""
    lines = []
    if 'numpy' in installed:
        if version_tuple(installed['numpy']) < NUMPY_FLOOR:
            raise Unsupported(f'the image\'s numpy {installed["numpy"]} is older than '
                              f'{".".join(map(str, NUMPY_FLOOR))}, the oldest requirements-container.txt installs '
                              'with (pandas 2.0.3 on Python 3.8): this container tag is not supported '
                              '(docs/docker.md)')
        lines.append(f'numpy=={installed["numpy"]}')
    protobuf = installed.get('protobuf')
    if protobuf and version_tuple(protobuf) >= PROTOBUF_FLOOR:
        lines.append(f'protobuf=={protobuf}')
    else:
        lines.append(f'protobuf>={".".join(map(str, PROTOBUF_FLOOR))},<4')
    return lines


def installed_versions():
    return {(d.metadata['Name'] or '').lower(): d.version for d in importlib.metadata.distributions()}


def driver_loads():
    try:
        ctypes.CDLL(DRIVER)
        return True
    except OSError:
        return False


def find_stub(environ):
    """CUDA's stub of the driver library (CUDA_STUBS_DIR first), or None."""
    folders = [environ['CUDA_STUBS_DIR']] if environ.get('CUDA_STUBS_DIR') else list(STUB_FOLDERS)
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, 'libcuda.so*'))):
            return path
    return None


def rerun_with_stub(stub, environ):
    """Run this script again with `stub` loadable as libcuda.so.1 (does not return)."""
    folder = tempfile.mkdtemp(prefix='rn50-cuda-stubs-')
    os.symlink(stub, os.path.join(folder, DRIVER))
    env = dict(environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [folder, environ.get('LD_LIBRARY_PATH')])))
    env[STUBS_IN_USE] = folder
    print(f'container_setup: no CUDA driver (a docker build): loading MXNet with CUDA\'s stub {stub}', flush=True)
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), 'check'], env)


def import_mxnet():
    """MXNet loaded as the workers load it (cpu.load_mxnet), which also leaves its operators compiled in the image
    (rn50/world/operator_cache.py): a container's first workers read them instead of compiling them again."""
    from rn50.errors import RecipeError
    from rn50.world import cpu
    try:
        cpu.load_mxnet()
    except OSError as e:
        if DRIVER not in str(e):
            raise
        raise RecipeError(f'this MXNet needs the CUDA driver library ({e}) and neither the driver nor CUDA\'s stub '
                          f'of it was found ({", ".join(STUB_FOLDERS)}): set CUDA_STUBS_DIR to the folder of the '
                          'toolkit\'s stubs/libcuda.so') from None


def check(environ=os.environ):
    """Import everything the recipe needs, as a worker would, and check DALI's and Horovod's APIs."""
    if environ.get(STUBS_IN_USE):
        atexit.register(shutil.rmtree, environ[STUBS_IN_USE], True)
    elif not driver_loads():
        stub = find_stub(environ)
        if stub:
            rerun_with_stub(stub, environ)
    import_mxnet()
    for name in PACKAGES:
        importlib.import_module(name)
    bootstrap.on_path()
    import nvidia.dali
    from rn50.data import augment
    augment.check_dali()
    import horovod
    import horovod.mxnet as hvd
    from rn50.world import workers
    workers.check_horovod_api(hvd)
    print(f'container_setup: {len(PACKAGES)} packages, DALI {nvidia.dali.__version__} with automatic augmentation, '
          f'Horovod {horovod.__version__} with the API the recipe calls')


def main(argv):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('command', choices=['constraints', 'check'],
                        help='constraints: the pip constraints of the image\'s packages; check: everything loads')
    if parser.parse_args(argv).command == 'constraints':
        try:
            print('\n'.join(constraints(installed_versions())))
        except Unsupported as e:
            print(f'error: {e}', file=sys.stderr)
            return 2
        return 0
    from rn50.errors import RecipeError
    try:
        check()
    except RecipeError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
