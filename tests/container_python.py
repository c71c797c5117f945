"""The recipe under the container's Python (3.8), which has none of its packages, run by tests/test_container.py:

    python3.8 -I -S tests/container_python.py STDLIB.json WORKSPACE

vermin reads constructs and standard-library names, not types: `dict | dict` (3.9) passed it and raised TypeError
in the container. Here the modules of scripts/ and rn50/ are imported for real: each that imports no third-party
package must import (a module that asks for the project's Python, MXNet's, counts as needing one), and
scripts/fault_tools.py's epoch_metrics reads WORKSPACE's DLLogger file, with empty stand-ins for the packages its imports
load (psutil, MXNet, tqdm; it calls none of them). STDLIB.json lists the standard library's top-level names (the
suite's Python has the list), so that a module 3.8's library lacks is a failure, not a third-party package.
Prints one JSON line: {'imported': [...], 'third-party': {module: package}, 'failed': {module: traceback},
'epoch_metrics': [...]}.
"""
import importlib
import json
import os
import sys
import traceback
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, 'scripts')
sys.path[:0] = [SCRIPTS, ROOT]    # as a script runs: its folder first, the repository importable

from rn50.launch import interpreter  # noqa: E402


def needs_project_python(module='mxnet'):
    """use_project_python's stand-in: the module is a third-party package here (the real one runs the
    command again under .venv's Python)."""
    raise ModuleNotFoundError(f'No module named {module!r}', name=module)


def modules():
    """The importable names of every module of scripts/ and rn50/."""
    names = sorted(name[:-3] for name in os.listdir(SCRIPTS) if name.endswith('.py'))
    for top, folders, files in os.walk(os.path.join(ROOT, 'rn50')):
        folders[:] = sorted(f for f in folders if f != '__pycache__')
        package = os.path.relpath(top, ROOT).replace(os.sep, '.')
        names += [package if name == '__init__.py' else f'{package}.{name[:-3]}'
                  for name in sorted(files) if name.endswith('.py')]
    return names


def import_all(stdlib):
    """(imported, {module: the third-party package it needs}, {module: why it failed}) of every module."""
    names = modules()
    imported, third_party, failed = [], {}, {}
    for name in names:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ModuleNotFoundError as e:
            missing = (e.name or '').split('.')[0]
            if missing and missing not in stdlib and missing != 'rn50' and missing not in names:
                third_party[name] = missing
            else:
                failed[name] = traceback.format_exc()
        except Exception:
            failed[name] = traceback.format_exc()
    return imported, third_party, failed


def epoch_metrics(workspace):
    """fault_tools.epoch_metrics(workspace), its imports' third-party packages stood in for by empty modules."""
    for package in ('psutil', 'mxnet', 'tqdm'):
        sys.modules.setdefault(package, types.ModuleType(package))
    import fault_tools
    return fault_tools.epoch_metrics(workspace)


if __name__ == '__main__':
    interpreter.use_project_python = needs_project_python
    with open(sys.argv[1]) as f:
        standard_library = set(json.load(f))
    imported, third_party, failed = import_all(standard_library)
    try:
        metrics = epoch_metrics(sys.argv[2])
    except Exception:
        failed['fault_tools.epoch_metrics'] = traceback.format_exc()
        metrics = None
    print(json.dumps({'imported': imported, 'third-party': third_party, 'failed': failed,
                      'epoch_metrics': metrics}))
