"""The code layout: the entry points at the root, everything else in rn50/ with a folder per concern, imports
running one way (root -> rn50, never back), no import cycle, and docs/design.md naming the folders there are."""
import ast
import os
import re
import warnings

from conftest import ROOT

ENTRY_POINTS = {'train', 'fit', 'data', 'dali', 'models', 'benchmark', 'runner'}
PACKAGE = 'rn50'
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
                modules[dotted.removesuffix('.__init__')] = path
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
