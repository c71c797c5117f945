"""The code layout: imports between the project's modules run one way, and no module grows unreadable."""
import ast
import os

from conftest import ROOT

MAX_LINES = 500


def project_modules():
    """{module name: path} of the Python modules at the repository root, the runner (a script without the
    .py suffix) included."""
    modules = {name[:-3]: os.path.join(ROOT, name) for name in os.listdir(ROOT) if name.endswith('.py')}
    modules['runner'] = os.path.join(ROOT, 'runner')
    return modules


def imported_modules(path, known):
    """The project modules `path` imports anywhere (module level or inside functions)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split('.')[0])
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


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set()}) is None


def test_imports_run_one_way():
    graph = import_graph()
    # train.py composes; nothing imports it but the runner, which parses train.py's flags with its parser.
    assert not [name for name, targets in graph.items() if 'train' in targets and name != 'runner']
    # The runner is the plan; supervising horovodrun is supervisor.py's, which needs no project module.
    assert 'supervisor' in graph['runner'] and not graph['supervisor']
    # Training never builds loaders or reads data files itself: train.py hands it a loader factory.
    assert not graph['fit'] & {'dali', 'train', 'workers'}
    assert graph['dali'] >= {'data'} and 'dali' not in graph['data']


def test_modules_stay_readable():
    for name, path in project_modules().items():
        with open(path) as f:
            lines = sum(1 for _ in f)
        assert lines <= MAX_LINES, f'{name}.py has {lines} lines'
