"""NVIDIA's container as the Dockerfile builds it, without Docker: every file it runs is Python 3.8 (read by vermin,
and imported by a real Python 3.8 where the machine has one), the image's protobuf cannot fail the install, and
no build step loads MXNet without the CUDA driver's stand-in (scripts/container_setup.py), checked on a twin
where importing MXNet needs libcuda.so.1 as NVIDIA's does."""
import ast
import glob
import importlib.metadata
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
import test_dependencies

sys.path.insert(0, os.path.join(ROOT, 'scripts'))
import container_setup  # noqa: E402

SETUP = os.path.join(ROOT, 'scripts', 'container_setup.py')


def run_steps():
    """The shell commands of the Dockerfile's RUN instructions, continuation lines joined."""
    with open(os.path.join(ROOT, 'Dockerfile')) as f:
        text = re.sub(r'\\\n', ' ', f.read())
    return [line[len('RUN '):].strip() for line in text.splitlines() if line.startswith('RUN ')]


@pytest.mark.unit
def test_every_file_the_container_runs_is_python_3_8():
    """vermin (the minimum Python each construct and standard-library member needs) over the recipe's files:
    scripts/fault_tools.py called os.waitstatus_to_exitcode (3.9), so the fault campaign died in the container."""
    files = test_dependencies.runtime_files()
    vermin = os.path.join(os.path.dirname(sys.executable), 'vermin')
    result = subprocess.run([vermin, '--no-tips', '--violations', '-t=3.8-', *files], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def container_python():
    """A Python 3.8, the 22.xx containers' (pyenv's 3.8.x, else python3.8 on PATH); None where there is none."""
    pyenv = os.environ.get('PYENV_ROOT') or os.path.expanduser('~/.pyenv')
    for python in sorted(glob.glob(os.path.join(pyenv, 'versions', '3.8.*', 'bin', 'python3.8'))) + \
            [shutil.which('python3.8')]:
        if python and subprocess.run([python, '-c', 'import sys; assert sys.version_info[:2] == (3, 8)'],
                                     capture_output=True).returncode == 0:
            return python
    return None


CONTAINER_PYTHON = container_python()


@pytest.mark.skipif(CONTAINER_PYTHON is None or sys.version_info < (3, 10),
                    reason='needs a Python 3.8 (pyenv install 3.8.18) and the suite on 3.10+ (its standard '
                           'library\'s names)')
@pytest.mark.unit
def test_the_recipe_imports_and_the_campaign_runs_its_merge_under_python_3_8(tmp_path):
    """Issue 57 item 1: vermin reads constructs, not types: fault_tools.epoch_metrics merged dicts with `|`
    (Python 3.9), a TypeError in the container that vermin passed. A real Python 3.8, without the recipe's
    packages (tests/container_python.py), imports every module of scripts/ and rn50/ that needs none at import,
    and runs epoch_metrics on a DLLogger file."""
    (tmp_path / 'stdlib.json').write_text(json.dumps(sorted(sys.stdlib_module_names)))
    records = [{'type': 'LOG', 'step': [0, 3], 'data': {'train.loss': 2.5}},
               {'type': 'LOG', 'step': [0], 'data': {'train.loss': 2.0, 'train.ips': 90.5}}]
    (tmp_path / 'dllogger_log.log').write_text(''.join(f'DLLL {json.dumps(r)}\n' for r in records))
    result = subprocess.run([CONTAINER_PYTHON, '-I', '-S', os.path.join(ROOT, 'tests', 'container_python.py'),
                             str(tmp_path / 'stdlib.json'), str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert not found['failed'], '\n'.join(found['failed'].values())
    assert {'bootstrap', 'container_setup', 'rn50.errors', 'rn50.flags', 'rn50.config.recipes',
            'rn50.launch.interpreter'} <= set(found['imported']), found
    assert found['third-party']['runner'] == 'mxnet'   # the entry points are tried too
    assert found['epoch_metrics'] == [{'train.loss': 2.0, 'epoch': 0}]


# The container's twin (the Makefile's `twin`, which `make test` builds where the machine has a Python 3.8).
TWIN = os.path.join(ROOT, '.venv-3.8', 'bin', 'python')


@pytest.mark.skipif(not os.access(TWIN, os.X_OK) or sys.version_info < (3, 10),
                    reason='needs the container\'s twin, .venv-3.8 (make twin, with a Python 3.8), and the suite on '
                           '3.10+ (its standard library\'s names)')
@pytest.mark.unit
def test_every_module_of_the_recipe_imports_in_the_containers_twin(tmp_path):
    """Issue 57 item 1: under Python 3.8 with the container's packages (the image's MXNet and numpy,
    requirements-container*.txt: .venv-3.8), every module imports: the entry points and the runner, scripts/ and
    rn50/. Only pytorch_peer.py lacks its package, PyTorch, whose peer runs in .venv-consumers. The sweep found
    Pillow 10.4.0's import failing with numpy 1.20.3."""
    (tmp_path / 'stdlib.json').write_text(json.dumps(sorted(sys.stdlib_module_names)))
    (tmp_path / 'dllogger_log.log').write_text('DLLL {"type": "LOG", "step": [0], "data": {"train.loss": 2.0}}\n')
    result = subprocess.run([TWIN, os.path.join(ROOT, 'tests', 'container_python.py'), str(tmp_path / 'stdlib.json'),
                             str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert not found['failed'], '\n'.join(found['failed'].values())
    assert found['third-party'] == {'pytorch_peer': 'torch'}
    assert {'train', 'runner', 'benchmark', 'fault_campaign', 'rn50.world.workers', 'rn50.inference.export'} <= \
        set(found['imported'])
    assert found['epoch_metrics'] == [{'train.loss': 2.0, 'epoch': 0}]


def pins(name):
    """{distribution: version} of a requirement file's `name==version` lines."""
    with open(os.path.join(ROOT, name)) as f:
        return dict(line.split('#')[0].strip().split('==') for line in f if '==' in line.split('#')[0])


@pytest.mark.unit
def test_the_twins_test_packages_are_the_suites_where_python_3_8_has_them():
    """requirements-container-dev.txt holds the suite's own pins (requirements-dev.txt) that .venv-3.8 needs, at
    the same versions but TensorBoard's, whose 2.16.2 needs Python 3.9."""
    suite, twin = pins('requirements-dev.txt'), pins('requirements-container-dev.txt')
    assert set(twin) <= set(suite), set(twin) - set(suite)
    assert {name: (suite[name], version) for name, version in twin.items() if suite[name] != version} == \
        {'tensorboard': ('2.16.2', '2.14.0')}


def docker_regex(pattern):
    """A .dockerignore pattern (cleaned) as Docker's regular expression (moby/patternmatcher): `*` and `?` within
    one name, `**/` any number of folders (none too), a final `**` anything; no character classes or escapes,
    which this repository's patterns do not use."""
    assert not set('[\\') & set(pattern), f'{pattern}: character classes and escapes are not implemented here'
    regex, i = '', 0
    while i < len(pattern):
        if pattern.startswith('**/', i):
            regex, i = regex + '(.*/)?', i + 3
        elif pattern.startswith('**', i):
            regex, i = regex + '.*', i + 2
        else:
            regex, i = regex + {'*': '[^/]*', '?': '[^/]'}.get(pattern[i], re.escape(pattern[i])), i + 1
    return re.compile(f'^{regex}$')


def dockerignore_rules(text):
    """(regular expression, excludes) of each pattern of a .dockerignore, in order, as Docker reads them: blank
    lines and `#` comments skipped, `!` an exception, the path cleaned and taken from the context's root."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        exception = line.startswith('!')
        pattern = posixpath.normpath(line[1:].strip() if exception else line)
        rules.append((docker_regex(pattern[1:] if len(pattern) > 1 and pattern.startswith('/') else pattern),
                      not exception))
    return rules


def docker_context(folder):
    """The files of `folder` that `docker build folder` sends, as '/'-separated relative paths: a file is left out
    when the last pattern that matches it or one of its folders is not an exception."""
    with open(os.path.join(folder, '.dockerignore')) as f:
        rules = dockerignore_rules(f.read())

    def sent(path):
        parts, decision = path.split('/'), True
        for regex, excludes in rules:
            if any(regex.match('/'.join(parts[:n])) for n in range(1, len(parts) + 1)):
                decision = not excludes
        return decision
    paths = [os.path.relpath(os.path.join(top, name), folder).replace(os.sep, '/')
             for top, _, names in os.walk(folder) for name in names]
    return {path for path in paths if sent(path)}


def gitignored_examples():
    """A path of each kind .gitignore lists (a `*` taken as `x`; a folder with a file in it; a pattern without a
    '/' but a final one, which matches at any depth, also down in rn50/)."""
    with open(os.path.join(ROOT, '.gitignore')) as f:
        patterns = [line.strip() for line in f if line.strip() and not line.startswith('#')]
    examples = []
    for pattern in patterns:
        name = pattern.strip('/').replace('*', 'x') + ('/x' if pattern.endswith('/') else '')
        examples += [name] + ([] if '/' in pattern.rstrip('/') else [f'rn50/nets/{name}'])
    return examples


@pytest.mark.unit
def test_the_build_context_holds_the_recipe_and_no_environment_dataset_or_run(tmp_path):
    """Issue 57 item 2: `COPY . .` bakes the build context into the image, and .dockerignore left .venv-consumers
    (about 2 GB after make test) in it. On a tree of the recipe's files with every environment, dataset, run,
    export and report .gitignore lists, and another environment: none of those is sent, every file of the
    recipe (the entry points, rn50/, scripts/, the requirements) and of the Dockerfile's COPY lines is."""
    tracked = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    unwanted = gitignored_examples() + ['.venv-3.8/bin/python', '.venv-consumers/lib/torch/x.so',
                                        'data/imagenet/train.rec', 'runs/demo/model_last.state', '.git/HEAD']
    for path in tracked + unwanted:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    shutil.copyfile(os.path.join(ROOT, '.dockerignore'), tmp_path / '.dockerignore')
    context = docker_context(tmp_path)
    assert not [path for path in unwanted if path in context], sorted(context - set(tracked))
    with open(os.path.join(ROOT, 'Dockerfile')) as f:
        copied = [source for line in f if line.startswith('COPY ') for source in line.split()[1:-1] if source != '.']
    recipe = [path for path in tracked if '/' not in path and (path.endswith('.py') or path == 'runner') or
              path.startswith(('rn50/', 'scripts/', 'requirements'))]
    assert {'train.py', 'runner', 'rn50/errors.py', 'scripts/container_setup.py', 'requirements.txt'} <= set(recipe)
    assert not [path for path in recipe + copied if path not in context]


@pytest.mark.unit
def test_no_build_step_loads_mxnet_but_the_check_that_brings_the_cuda_stub():
    """A docker build has no CUDA driver: a RUN step that imports MXNet (horovod.mxnet, the recipe) fails there.
    Only container_setup.py's check may, which loads MXNet with CUDA's stub library."""
    steps = run_steps()
    assert 'python scripts/container_setup.py check' in steps
    for step in steps:
        for command in step.split('&&'):
            words = shlex.split(command)
            if not words or words[0] not in ('python', 'python3'):
                continue
            if words[1:2] == ['-c']:
                imported = {alias for node in ast.walk(ast.parse(words[2])) for alias in
                            ([a.name for a in node.names] if isinstance(node, ast.Import) else
                             [node.module] if isinstance(node, ast.ImportFrom) else [])}
                assert not any(name.split('.')[0] in ('mxnet', 'horovod', 'rn50') for name in imported), step
            else:
                assert words[1] == 'scripts/container_setup.py', f'{step}: a script at build time'


@pytest.mark.unit
def test_the_images_protobuf_is_kept_from_3_20_2_and_raised_within_3_below():
    assert container_setup.constraints({'numpy': '1.23.5', 'protobuf': '3.20.3'}) == \
        ['numpy==1.23.5', 'protobuf==3.20.3']
    assert container_setup.constraints({'numpy': '1.20.3', 'protobuf': '4.21.12'}) == \
        ['numpy==1.20.3', 'protobuf==4.21.12']
    for old in ('3.19.6', '3.12.4', '3.20.1'):
        assert container_setup.constraints({'numpy': '1.22.2', 'protobuf': old}) == \
            ['numpy==1.22.2', 'protobuf>=3.20.2,<4']
    assert container_setup.constraints({}) == ['protobuf>=3.20.2,<4']


@pytest.mark.unit
def test_an_image_with_a_numpy_older_than_the_pins_need_is_one_error_line(monkeypatch, capsys):
    """pandas 2.0.3 needs numpy 1.20.3 on Python 3.8: an older image's install was pip's ResolutionImpossible
    after the constraints; the build stops at them instead, saying why."""
    assert container_setup.constraints({'numpy': '1.20.3'}) == ['numpy==1.20.3', 'protobuf>=3.20.2,<4']
    for old in ('1.19.5', '1.20.2'):
        monkeypatch.setattr(container_setup, 'installed_versions', lambda: {'numpy': old, 'protobuf': '3.20.3'})
        assert container_setup.main(['constraints']) == 2
        out, err = capsys.readouterr()
        assert out == '' and err == f"error: the image's numpy {old} is older than 1.20.3, the oldest " \
            'requirements-container.txt installs with (pandas 2.0.3 on Python 3.8): this container tag is not ' \
            'supported (docs/docker.md)\n'


def installed_pin(name):
    """requirements-container.txt's version of `name` when that is the installed one (the twin's), else None."""
    with open(os.path.join(ROOT, 'requirements-container.txt')) as f:
        pinned = dict(line.strip().split('==') for line in f if '==' in line and not line.startswith('#'))
    try:
        return pinned[name] if importlib.metadata.version(name) == pinned[name] else None
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(sys.version_info[:2] != (3, 8) or not installed_pin('pandas'),
                    reason='reads the metadata of requirements-container.txt\'s pandas under Python 3.8: the '
                           'container\'s twin (.venv-3.8, make twin)')
@pytest.mark.unit
def test_the_numpy_floor_is_what_the_pinned_pandas_needs_on_python_3_8():
    floors = [re.match(r'numpy\s*\(?>=\s*([0-9.]+)', requirement).group(1)
              for requirement in importlib.metadata.requires('pandas')
              if requirement.startswith('numpy') and 'extra ==' not in requirement and
              re.search(r'python_version\s*<\s*"3\.(9|10)"', requirement)]
    assert [container_setup.version_tuple(floor) for floor in floors] == [container_setup.NUMPY_FLOOR], floors


@pytest.mark.unit
def test_the_protobuf_floor_is_what_the_pinned_packages_need():
    """The packages of requirements-container.txt that need protobuf accept container_setup's floor: read from
    their own metadata (the same versions are installed here)."""
    with open(os.path.join(ROOT, 'requirements-container.txt')) as f:
        pins = dict(line.strip().split('==') for line in f if '==' in line and not line.startswith('#'))
    floors = {}
    for name, version in pins.items():
        try:
            if importlib.metadata.version(name) != version:
                continue
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            match = re.match(r'protobuf\s*\(?>=\s*([0-9.]+)', requirement)
            if match and 'extra ==' not in requirement:
                floors[name] = container_setup.version_tuple(match.group(1))
    assert {'onnx', 'tensorboardX'} <= set(floors), floors
    assert max(floors.values()) <= container_setup.PROTOBUF_FLOOR, floors


# NVIDIA's libmxnet.so needs libcuda.so.1 to load: the twin's mxnet loads it, then becomes the real package.
NEEDS_DRIVER = '''
import ctypes, importlib, os, sys
ctypes.CDLL('libcuda.so.1')
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]
del sys.modules['mxnet']
sys.modules['mxnet'] = importlib.import_module('mxnet')
'''


@pytest.mark.integration
def test_the_build_check_loads_an_mxnet_that_needs_the_driver_through_cudas_stub(tmp_path):
    fake = tmp_path / 'needs_driver'
    (fake / 'mxnet').mkdir(parents=True)
    (fake / 'mxnet' / '__init__.py').write_text(NEEDS_DRIVER)
    stubs, empty = tmp_path / 'stubs', tmp_path / 'empty'
    stubs.mkdir()
    empty.mkdir()
    import _ctypes   # any shared object stands in for CUDA's stubs/libcuda.so
    os.symlink(_ctypes.__file__, stubs / 'libcuda.so')
    env = dict(os.environ, PYTHONPATH=str(fake), XDG_CACHE_HOME=str(tmp_path / 'cache'))
    env.pop('LD_LIBRARY_PATH', None)

    plain = subprocess.run([sys.executable, '-c', 'import horovod.mxnet'], env=env, capture_output=True, text=True)
    assert plain.returncode != 0 and 'libcuda.so.1' in plain.stderr   # the build's failure, reproduced

    without = subprocess.run([sys.executable, SETUP, 'check'], env=dict(env, CUDA_STUBS_DIR=str(empty)),
                             capture_output=True, text=True)
    assert without.returncode == 2, without.stderr
    assert [line for line in without.stderr.splitlines() if line.startswith('error:')] == \
        [without.stderr.strip()] and 'CUDA_STUBS_DIR' in without.stderr

    with_stub = subprocess.run([sys.executable, SETUP, 'check'], env=dict(env, CUDA_STUBS_DIR=str(stubs)),
                               capture_output=True, text=True)
    assert with_stub.returncode == 0, with_stub.stderr[-2000:]
    assert f"CUDA's stub {stubs / 'libcuda.so'}" in with_stub.stdout
    assert 'with the API the recipe calls' in with_stub.stdout
    from rn50.world import operator_cache      # the image keeps MXNet's operators compiled, loaded as a worker would
    assert len(operator_cache.read(str(tmp_path / 'cache' / 'rn50' / operator_cache.CACHE_NAME))) > 2000
    assert not list(tmp_path.glob('rn50-cuda-stubs-*')) and not [
        entry for entry in os.listdir('/tmp') if entry.startswith('rn50-cuda-stubs-') and
        os.path.islink(os.path.join('/tmp', entry, 'libcuda.so.1')) and
        os.readlink(os.path.join('/tmp', entry, 'libcuda.so.1')) == str(stubs / 'libcuda.so')]
