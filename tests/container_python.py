"""The recipe under the container's Python (3.8), run by tests/test_container.py, bare or in the container's twin:

    python3.8 -I -S tests/container_python.py STDLIB.json WORKSPACE        # none of the recipe's packages
    .venv-3.8/bin/python tests/container_python.py STDLIB.json WORKSPACE   # the twin: the container's packages

vermin reads constructs and standard-library names, not types: `dict | dict` (3.9) passed it and raised TypeError
in the container. Here every module of the recipe is imported for real (the entry points, the runner among them,
scripts/ and rn50/): each that imports no package the interpreter lacks must import (a module that asks for the
project's Python, for MXNet or PyTorch, counts as needing that package when it is not here), and
scripts/fault_tools.py's epoch_metrics reads WORKSPACE's DLLogger file, with empty stand-ins for the packages its
imports load where they are missing (psutil, MXNet, tqdm; it calls none of them). STDLIB.json lists the standard
library's top-level names (the suite's Python has the list), so that a module 3.8's library lacks is a failure, not
a third-party package. Prints one JSON line: {'imported': [...], 'third-party': {module: package},
'failed': {module: traceback}, 'epoch_metrics': [...]}.
"""
import importlib
import importlib.machinery
import importlib.util
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
    """use_project_python's stand-in: nothing where the module imports here, as the real one; else the module
    is a third-party package this interpreter lacks (the real one would run the command again under .venv's
    Python, or .venv-consumers')."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f'No module named {module!r}', name=module)


ENTRY_POINTS = ('train', 'fit', 'data', 'dali', 'models', 'benchmark', 'runner')


def modules():
    """The importable names of every module of the recipe: the entry points, scripts/ and rn50/."""
    names = list(ENTRY_POINTS) + sorted(name[:-3] for name in os.listdir(SCRIPTS) if name.endswith('.py'))
    for top, folders, files in os.walk(os.path.join(ROOT, 'rn50')):
        folders[:] = sorted(f for f in folders if f != '__pycache__')
        package = os.path.relpath(top, ROOT).replace(os.sep, '.')
        names += [package if name == '__init__.py' else f'{package}.{name[:-3]}'
                  for name in sorted(files) if name.endswith('.py')]
    return names


def import_module(name):
    """The module `name`; the runner, a script without .py, from its file."""
    if name != 'runner':
        return importlib.import_module(name)
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(ROOT, name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def import_all(stdlib):
    """(imported, {module: the third-party package it needs}, {module: why it failed}) of every module."""
    names = modules()
    imported, third_party, failed = [], {}, {}
    argv = sys.argv
    for name in names:
        sys.argv = [name]   # a script that reads its flags at import (benchmark_loaders.py's --code) gets none
        try:
            import_module(name)
            imported.append(name)
        except ModuleNotFoundError as e:
            missing = (e.name or '').split('.')[0]
            if missing and missing not in stdlib and missing != 'rn50' and missing not in names:
                third_party[name] = missing
            else:
                failed[name] = traceback.format_exc()
        except BaseException:   # SystemExit too: argparse's, or a script's own at import
            failed[name] = traceback.format_exc()
        finally:
            sys.argv = argv
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
