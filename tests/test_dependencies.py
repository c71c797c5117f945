"""Every third-party package the recipe imports is installed by both set-ups that run it: the CPU set-up
(requirements.txt and the Makefile's own installs) and NVIDIA's container (its base image's MXNet, numpy, DALI
and Horovod, plus the Dockerfile's requirements-container*.txt). The tests' own imports come from
requirements-dev.txt and requirements-consumers.txt (the PyTorch packages that load export's torchvision weights, in
an environment of their own: tests/torch_consumers.py); the peers the benchmark scripts measure, and nothing else,
from the optional requirements-bench.txt (OpenVINO, in .venv) and requirements-consumers.txt (PyTorch, whose
peer runs in .venv-consumers). Imports are read with `ast`, inside functions too; an import name is mapped to its
distribution through the installed packages' metadata (plus KNOWN for names not installed here). `make setup`
keeps pip's conflict report about the packages installed without their dependencies out of its output, and
reports any other conflict."""
import ast
import functools
import glob
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit

# What nvcr.io/nvidia/mxnet ships itself (the Dockerfile installs none of these; its protobuf, which the ONNX
# tools need, is a constraint of the Dockerfile's install): module prefixes.
BASE_IMAGE_MODULES = ('mxnet', 'numpy', 'nvidia.dali', 'horovod', 'google.protobuf')
# Import name -> distribution, for packages that may not be installed where the test runs (Horovod is built by
# `make setup` last; OpenCV is what MXNet's im2rec.py imports).
KNOWN = {'cv2': 'opencv-python-headless', 'horovod': 'horovod', 'openvino': 'openvino', 'torch': 'torch',
         'torchvision': 'torchvision', 'tensorrt': 'tensorrt', 'timm': 'timm'}
# The scripts that may import the peers they measure: OpenVINO (requirements-bench.txt, in .venv) and PyTorch
# (requirements-consumers.txt: pytorch_peer.py runs in .venv-consumers).
BENCHMARK_SCRIPTS = {'scripts/benchmark_inference.py', 'scripts/benchmark_training.py', 'scripts/pytorch_peer.py'}
# What only a GPU node's check imports, from that node's own software (NVIDIA's containers, `pip install tensorrt`);
# the check reports SKIP without it: module -> the scripts that may import it.
GPU_NODE_ONLY = {'tensorrt': {'scripts/gpu_check_export.py'}}

# The checks that map imports to distributions read sys.stdlib_module_names and
# importlib.metadata.packages_distributions (both Python 3.10) and the packages of .venv, the CPU set-up (KNOWN names
# only what .venv may lack): they read the repository's files, and the suite's Python 3.11 runs them. The
# container's twin (.venv-3.8, the Makefile) skips them.
MAPS_IMPORTS = pytest.mark.skipif(sys.version_info < (3, 10), reason='maps imports to .venv\'s distributions with '
                                  'sys.stdlib_module_names and importlib.metadata.packages_distributions (Python 3.10)')


def normalise(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def runtime_files():
    """The recipe's modules: the top-level *.py, the runner and scripts/*.py."""
    return sorted(glob.glob(os.path.join(ROOT, '*.py')) + [os.path.join(ROOT, 'runner')]
                  + glob.glob(os.path.join(ROOT, 'rn50', '**', '*.py'), recursive=True)
                  + glob.glob(os.path.join(ROOT, 'scripts', '*.py')))


def suite_files():
    return sorted(glob.glob(os.path.join(ROOT, 'tests', '*.py')))


def own_modules():
    """Module names of the project itself (scripts and tests import their neighbours by name)."""
    return {os.path.basename(path)[:-3] for path in runtime_files() + suite_files() if path.endswith('.py')} | {'rn50'}


def imports(path):
    """The absolute module names `path` imports anywhere (module level or inside functions)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def third_party(paths):
    """{module name: files importing it}, without the standard library and the project's own modules."""
    own = own_modules()
    found = {}
    for path in paths:
        for module in imports(path):
            top = module.split('.')[0]
            if top not in sys.stdlib_module_names and top not in own:
                found.setdefault(module, set()).add(os.path.relpath(path, ROOT))
    return found


@functools.lru_cache(maxsize=None)
def installed_distributions():
    return importlib.metadata.packages_distributions()


def distributions(module):
    """The normalised names of the distributions that can provide `module` (empty if unknown)."""
    top = module.split('.')[0]
    names = set(installed_distributions().get(top, []))
    if top in KNOWN:
        names.add(KNOWN[top])
    return {normalise(name) for name in names}


def requirement_names(*files):
    """Normalised distribution names of pip requirement files (`name==version` lines)."""
    names = set()
    for name in files:
        with open(os.path.join(ROOT, name)) as f:
            for line in f:
                line = line.split('#', 1)[0].strip()
                if line:
                    names.add(normalise(re.split(r'[=<>!~;\[ ]', line, 1)[0]))
    return names


def makefile_installs():
    """Distributions the Makefile installs by name besides the requirement files (Horovod, --no-deps ones)."""
    with open(os.path.join(ROOT, 'Makefile')) as f:
        lines = [line for line in f if 'pip install' in line]
    return {normalise(name) for line in lines for name in re.findall(r'\s([A-Za-z][\w.-]*)==[0-9]', line)}


def missing(modules, provided, base_modules=()):
    """{module: files} of `modules` whose distribution is not in `provided` and that no base module covers; the
    benchmark scripts' may come from the peers' files."""
    extras = peer_names()
    gaps = {}
    for module, files in modules.items():
        if any(module == base or module.startswith(base + '.') for base in base_modules):
            continue
        if files <= BENCHMARK_SCRIPTS and distributions(module) & extras:
            continue
        if files <= GPU_NODE_ONLY.get(module, set()):
            continue
        if not distributions(module) & provided:
            gaps[module] = sorted(files)
    return gaps


def peer_names():
    """The distributions of the peers the benchmark scripts measure: OpenVINO and PyTorch (not timm, which only
    the tests' consumers use)."""
    return requirement_names('requirements-bench.txt') | {'torch', 'torchvision'} & \
        requirement_names('requirements-consumers.txt')


@MAPS_IMPORTS
def test_only_the_benchmark_scripts_import_the_benchmark_peers():
    """OpenVINO and PyTorch come from the peers' files and only the benchmark scripts import them; PyTorch is
    never installed into .venv (requirements-bench.txt): the suite's processes that imported Horovod crashed at
    PyTorch's import."""
    assert not {'torch', 'torchvision'} & requirement_names('requirements-bench.txt')
    importers = {module: files for module, files in third_party(runtime_files()).items()
                 if distributions(module) & peer_names()}
    assert set(importers) == {'openvino', 'torch', 'torchvision'}
    assert all(files <= BENCHMARK_SCRIPTS for files in importers.values())


CPU_SET_UP = ('requirements.txt',)
CONTAINER = ('requirements-container.txt', 'requirements-container-nodeps.txt')


@MAPS_IMPORTS
def test_the_cpu_set_up_installs_every_package_the_recipe_imports():
    provided = requirement_names(*CPU_SET_UP) | makefile_installs()
    assert missing(third_party(runtime_files()), provided) == {}


@MAPS_IMPORTS
def test_the_container_gets_every_package_the_recipe_imports():
    provided = requirement_names(*CONTAINER)
    assert missing(third_party(runtime_files()), provided, BASE_IMAGE_MODULES) == {}


@MAPS_IMPORTS
def test_the_tests_imports_come_from_the_dev_requirements():
    provided = requirement_names(*CPU_SET_UP, 'requirements-dev.txt', 'requirements-consumers.txt') | makefile_installs()
    assert missing(third_party(suite_files()), provided) == {}


@MAPS_IMPORTS
def test_every_import_maps_to_a_distribution():
    """An import the mapping cannot name would pass the checks above unseen: add it to KNOWN."""
    unknown = [module for module in third_party(runtime_files() + suite_files()) if not distributions(module)]
    assert unknown == []


@MAPS_IMPORTS
def test_the_checker_finds_what_the_old_dockerfile_missed():
    """The Dockerfile's install before the pins (`pip install Pillow scikit-learn matplotlib psutil onnx
    onnxruntime`) lacked tqdm (logs.py, so every start) and safetensors (--load *.safetensors), and lacks what the
    recipe imported since: tensorboardX (--tensorboard), mlperf_logging (the MLPerf result log), tritonclient
    (--triton) and imagehash (prepare_dataset.py's leakage check). SciPy (int8.py, --calib-mode entropy) came with
    scikit-learn, which depends on it."""
    old = {normalise(name) for name in 'Pillow scikit-learn matplotlib psutil onnx onnxruntime scipy'.split()}
    gaps = missing(third_party(runtime_files()), old, BASE_IMAGE_MODULES)
    assert {module.split('.')[0] for module in gaps} == {'tqdm', 'safetensors', 'tensorboardX', 'mlperf_logging',
                                                         'tritonclient', 'imagehash'}
    assert gaps['mlperf_logging.mllog'] == ['rn50/reports/mlperf_log.py']
    assert 'rn50/reports/logs.py' in gaps['tqdm'] and 'rn50/checkpoints/weight_loading.py' in gaps['safetensors.numpy']


def test_the_container_pins_are_exact_and_the_dockerfile_installs_them():
    for name in CONTAINER:
        with open(os.path.join(ROOT, name)) as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith('#')]
        assert lines and all(re.fullmatch(r'[A-Za-z][\w.-]*==[0-9][\w.]*', line) for line in lines), lines
    with open(os.path.join(ROOT, 'Dockerfile')) as f:
        dockerfile = f.read()
    # The image's numpy and protobuf are constraints of the install (scripts/container_setup.py; its own
    # test_container.py), and the --no-deps file stays so.
    assert re.search(r'pip install [^\n]*-c /tmp/container.txt -r requirements-container.txt', dockerfile)
    assert re.search(r'pip install [^\n]*--no-deps -r requirements-container-nodeps.txt', dockerfile)
    assert 'numpy' not in requirement_names(*CONTAINER) and 'protobuf' not in requirement_names(*CONTAINER)


def makefile_commands():
    """The Makefile's recipe lines but comments, continuation lines joined."""
    with open(os.path.join(ROOT, 'Makefile')) as f:
        lines = f.read().replace('\\\n', ' ').splitlines()
    return [line.strip() for line in lines if line.startswith('\t') and not line.strip().startswith('#')]


def test_setup_installs_without_pips_conflict_report_and_checks_the_rest():
    """pip printed "ERROR: pip's dependency resolver ..." with the dependencies gluoncv goes without on purpose
    whenever a later install (Horovod's pyyaml) touched one they depend on (seen in a throwaway venv): every
    install that resolves dependencies passes --no-warn-conflicts; the pip check that takes its place prints
    nothing on this project's environment, where gluoncv and onnxruntime lack theirs (.venv's set-up; the
    container's twin, .venv-3.8, does the same with its own)."""
    installs = [c for c in makefile_commands() if '$(PY) -m pip install ' in c and '--no-deps' not in c]
    assert len(installs) == 2 and all('--no-warn-conflicts' in c for c in installs), installs
    check = [c for c in makefile_commands() if '$(PY) -m pip check' in c]
    assert len(check) == 1
    command = check[0].replace('$(PY)', os.path.join(ROOT, '.venv', 'bin', 'python'))
    result = subprocess.run(['sh', '-c', command], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout == '' and result.stderr == ''
    unfiltered = subprocess.run([os.path.join(ROOT, '.venv', 'bin', 'python'), '-m', 'pip', 'check'],
                                capture_output=True, text=True)
    assert re.search(r'^gluoncv .* requires opencv-python', unfiltered.stdout, re.M)   # what the filter hides
