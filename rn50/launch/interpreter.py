"""The project's Python for every entry point: a command copied from the README into a fresh shell works.

`make setup` installs everything into `.venv`, but a new shell has not activated it: `./runner` (shebang
`python3`) or `python train.py` would start an interpreter without MXNet and die on `import mxnet`. Each
entry point therefore calls, before its first third-party import,

    from rn50.launch import interpreter
    interpreter.use_project_python()

which does nothing where MXNet is importable (an activated .venv, NVIDIA's container), and otherwise runs the
same command again with `.venv/bin/python`, with `.venv/bin` first on PATH (so `horovodrun` is found too); with
no `.venv` either, it is one `error:` line saying how to set up.
"""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # rn50/launch/ up
VENV = os.path.join(ROOT, '.venv')


def use_project_python():
    if importlib.util.find_spec('mxnet') is not None:
        return
    python = os.path.join(VENV, 'bin', 'python')
    # sys.prefix, not the executable: a venv's python is a link to the very interpreter that lacks MXNet.
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV) and os.access(python, os.X_OK):
        os.environ['PATH'] = os.path.join(VENV, 'bin') + os.pathsep + os.environ.get('PATH', '')
        os.environ['VIRTUAL_ENV'] = VENV
        os.execv(python, [python] + sys.argv)
    sys.exit(f'error: {sys.executable} cannot import MXNet. Run `make setup` in {ROOT} (it creates .venv, which '
             f'the recipe\'s commands then find by themselves), or use NVIDIA\'s MXNet container')
