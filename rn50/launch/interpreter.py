"""The project's Python for every entry point: a command copied from the README into a fresh shell works.

`make setup` installs everything into `.venv`, but a new shell has not activated it: `./runner` (shebang
`python3`) or `python train.py` would start an interpreter without MXNet and die on `import mxnet`. Each
entry point therefore calls, before its first third-party import,

    from rn50.launch import interpreter
    interpreter.use_project_python()              # MXNet: .venv
    interpreter.use_project_python('torch')       # PyTorch's peer: .venv-consumers (make consumers)

which does nothing where the module is importable (an activated .venv, NVIDIA's container), and otherwise runs
the same command again with the first of the project's environments that has it (`<env>/bin/python`, with
`<env>/bin` first on PATH, so `horovodrun` is found too); with none, it is one `error:` line saying how to set
up.
"""
import glob
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # rn50/launch/ up
VENV = os.path.join(ROOT, '.venv')
# The environments that may hold a module, in order, and how to get one that does.
ENVIRONMENTS = {'mxnet': ('.venv',), 'torch': ('.venv', '.venv-consumers')}
SET_UP = {'mxnet': 'Run `make setup` in {root} (it creates .venv, which the recipe\'s commands then find by '
                   'themselves), or use NVIDIA\'s MXNet container',
          'torch': 'Run `make consumers` in {root}: it creates .venv-consumers with PyTorch (make test does too); '
                   'not in .venv, where PyTorch imported after Horovod crashes the process'}


def has_module(environment, module):
    return bool(glob.glob(os.path.join(environment, 'lib', 'python*', 'site-packages', module)))


def other_environment(module):
    """The path of the first of the project's environments for `module` (ENVIRONMENTS), other than this
    interpreter's, that has it; None when none has."""
    for name in ENVIRONMENTS[module]:
        environment = os.path.join(ROOT, name)
        # sys.prefix, not the executable: a venv's python is a link to the very interpreter that lacks the module.
        if os.path.realpath(sys.prefix) != os.path.realpath(environment) and \
                os.access(os.path.join(environment, 'bin', 'python'), os.X_OK) and has_module(environment, module):
            return environment
    return None


def can_import(module):
    """Whether a script that calls use_project_python(module) gets `module`: here or in one of the project's
    environments (the benchmarks ask before running scripts/pytorch_peer.py)."""
    return importlib.util.find_spec(module) is not None or other_environment(module) is not None


def use_project_python(module='mxnet'):
    """Nothing where `module` imports here; else this command again under the project's environment that has
    it (other_environment), or one `error:` line saying how to make one (the module docstring)."""
    if importlib.util.find_spec(module) is not None:
        return
    environment = other_environment(module)
    if environment is None:
        what = 'MXNet' if module == 'mxnet' else module
        sys.exit(f'error: {sys.executable} cannot import {what}. {SET_UP[module].format(root=ROOT)}')
    python = os.path.join(environment, 'bin', 'python')
    os.environ['PATH'] = os.path.join(environment, 'bin') + os.pathsep + os.environ.get('PATH', '')
    os.environ['VIRTUAL_ENV'] = environment
    os.execv(python, [python] + sys.argv)
