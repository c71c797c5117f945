"""The code layout: the entry points at the root, everything else in rn50/ with a folder per concern, imports
running one way (root -> rn50, never back; between the folders too, and the modules below them importing no
folder), no import cycle, and docs/design.md naming the folders there are."""
import ast
import os
import re
import warnings

import pytest

from conftest import ROOT
from test_dependencies import imports

pytestmark = pytest.mark.unit

ENTRY_POINTS = {'train', 'fit', 'data', 'dali', 'models', 'benchmark', 'runner'}
PACKAGE = 'rn50'
# The modules of rn50/ outside its folders, below every one of them: they import none.
BELOW_THE_FOLDERS = {'rn50.errors', 'rn50.files', 'rn50.flags'}
# A warning sign: a module over LONG_MODULE lines is split where a concern ends, if one does, never shortened
# to fit; over TOO_LONG (the size of the functions and files the peer recipes are read for) it fails.
LONG_MODULE = 500
TOO_LONG = 700


def project_modules():
    """{dotted module name: path}: the root's modules (the runner, a script without .py, included) and every
    module of the package (a folder's __init__.py under the folder's name)."""
    modules = {name[:-3]: os.path.join(ROOT, name) for name in os.listdir(ROOT) if name.endswith('.py')}
    modules['runner'] = os.path.join(ROOT, 'runner')
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
                package = dotted.endswith('.__init__')   # (no str.removesuffix in the container's Python 3.8)
                modules[dotted[:-len('.__init__')] if package else dotted] = path
    return modules


def imported_modules(path, known):
    """The project modules `path` imports anywhere (module level or inside functions): `from rn50.x import y`
    counts as rn50.x.y when that is a module, else as rn50.x."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(f'{node.module}.{alias.name}' if f'{node.module}.{alias.name}' in known else node.module
                         for alias in node.names)
    return found & known


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(module, trail):
        state[module] = 'open'
        for target in sorted(graph[module]):
            if state.get(target) == 'open':
                return trail[trail.index(target):] + [target]
            if target not in state:
                cycle = visit(target, trail + [target])
                if cycle:
                    return cycle
        state[module] = 'done'
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def import_graph():
    modules = project_modules()
    return {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}


def folder_of(module):
    """The folder of rn50/ that holds `module` ('rn50.data.contract' -> 'data'); None outside the folders."""
    parts = module.split('.')
    return parts[1] if parts[0] == PACKAGE and len(parts) > 2 or module in package_folder_modules() else None


def package_folder_modules():
    return {f'{PACKAGE}.{folder}' for folder in package_folders()}


def folder_graph(graph=None):
    """{folder of rn50/: the other folders its modules import}, from the module graph."""
    graph = import_graph() if graph is None else graph
    folders = {}
    for module, targets in graph.items():
        folder = folder_of(module)
        if folder is not None:
            folders.setdefault(folder, set()).update(
                target for target in map(folder_of, targets) if target not in (None, folder))
    return folders


def third_party_imports(path):
    """The top-level names of every module `path` imports anywhere (mxnet, numpy, rn50, os, ...)."""
    return {module.split('.')[0] for module in imports(path)}


def package_folders():
    return sorted(name for name in os.listdir(os.path.join(ROOT, PACKAGE))
                  if os.path.isfile(os.path.join(ROOT, PACKAGE, name, '__init__.py')))


def test_the_root_holds_the_entry_points_and_the_package_the_rest():
    assert {name for name in project_modules() if not name.startswith(PACKAGE)} == ENTRY_POINTS


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set()}) is None


def test_the_package_never_imports_the_root():
    graph = import_graph()
    backwards = {name: sorted(targets & ENTRY_POINTS) for name, targets in graph.items()
                 if name.startswith(PACKAGE) and targets & ENTRY_POINTS}
    assert backwards == {}


def test_the_layout_test_sees_imports_both_ways():
    """The checks above would pass on a graph they cannot read: a module of each kind imports what it should."""
    graph = import_graph()
    assert 'rn50.training.step' in graph['fit'] and 'rn50.errors' in graph['rn50.training.step']
    assert 'models' in graph['train'] and 'rn50.nets.layers' in graph['models']


def test_imports_run_one_way():
    graph = import_graph()
    # train.py composes; nothing imports it but the runner, which parses train.py's flags with its parser.
    assert not [name for name, targets in graph.items() if 'train' in targets and name != 'runner']
    # The runner is the plan; supervising horovodrun needs no project module.
    assert 'rn50.launch.supervisor' in graph['runner'] and not graph['rn50.launch.supervisor']
    # Training never builds loaders or reads data files itself: train.py hands it a loader factory.
    assert not graph['fit'] & {'dali', 'train', 'rn50.world.workers'}
    assert 'data' in graph['dali'] or graph['dali'] & {'rn50.data.contract'}
    assert 'dali' not in graph['data']


def test_folders_import_one_way():
    """No two folders of rn50/ import each other, nor does any chain of them come back (imports inside functions
    count): each concern builds on those below it."""
    graph = folder_graph()
    assert 'optim' in graph['training'] and 'checkpoints' in graph['config']     # the graph is read
    both_ways = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, ())})
    assert both_ways == []
    assert find_cycle(graph) is None


def test_the_modules_below_the_folders_import_none():
    graph = import_graph()
    assert {name: sorted(graph[name]) for name in BELOW_THE_FOLDERS if graph[name] - BELOW_THE_FOLDERS} == {}
    assert BELOW_THE_FOLDERS <= set(graph)


def test_the_flag_types_are_at_the_bottom_and_load_no_mxnet():
    """rn50/flags.py, which the runner and benchmark.py parse with before anything else, and train.py's Run group
    import nothing of the project (but the Run group its recipes) and no MXNet, not even through another module."""
    modules = project_modules()
    assert third_party_imports(modules['rn50.flags']) <= {'argparse', 'math'}
    graph, seen, todo = import_graph(), set(), ['rn50.flags', 'rn50.config.run_flags']
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(graph[module])
    assert seen == {'rn50.flags', 'rn50.config.run_flags', 'rn50.config.recipes', 'rn50.optim.schedule',
                    'rn50.errors'}
    assert not any({'mxnet', 'numpy'} & third_party_imports(modules[module]) for module in seen)


def test_the_folder_graph_finds_folders_that_import_each_other():
    graph = folder_graph({'rn50.a.x': {'rn50.b.y', 'rn50.errors'}, 'rn50.b.y': {'rn50.a.z'}, 'rn50.a.z': set(),
                          'rn50.errors': set(), 'train': {'rn50.a.x'}})
    assert graph == {'a': {'b'}, 'b': {'a'}}


def test_every_folder_says_what_it_holds():
    for folder in package_folders():
        with open(os.path.join(ROOT, PACKAGE, folder, '__init__.py')) as f:
            tree = ast.parse(f.read())
        assert ast.get_docstring(tree), f'rn50/{folder}/__init__.py has no docstring'
        assert len(tree.body) == 1, f'rn50/{folder}/__init__.py does more than say what the folder holds'


def test_the_design_document_lists_the_folders_there_are():
    with open(os.path.join(ROOT, 'docs', 'design.md')) as f:
        design = f.read()
    tree = re.search(r'^rn50/\n((?:  .*\n)+)', design, flags=re.M)     # the layout's rn50/ branch
    assert tree, 'docs/design.md has no rn50/ tree'
    assert sorted(re.findall(r'^  (\w+)/ ', tree.group(1), flags=re.M)) == package_folders()


def test_modules_stay_readable():
    """Over LONG_MODULE lines: a warning in the test report; over TOO_LONG: a failure."""
    for name, path in project_modules().items():
        with open(path) as f:
            lines = sum(1 for _ in f)
        assert lines <= TOO_LONG, f'{name} has {lines} lines'
        if lines > LONG_MODULE:
            warnings.warn(f'{name} has {lines} lines: is it still one concern?')
