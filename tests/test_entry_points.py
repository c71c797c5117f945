"""Every entry point works from a fresh shell that did not activate .venv: started by an interpreter without
MXNet, it runs itself again with the project's .venv (interpreter.py)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, deferred_by_mxnet, modules_imported

pytestmark = pytest.mark.integration

def scripts_run_as_programs():
    """Every file of scripts/ that runs as a program (`if __name__ == '__main__'`; the others are its helpers)."""
    folder = os.path.join(ROOT, 'scripts')
    return sorted(f'scripts/{name}' for name in os.listdir(folder) if name.endswith('.py') and
                  "if __name__ == '__main__'" in open(os.path.join(folder, name)).read())


ENTRY_POINTS = ['runner', 'train.py', 'benchmark.py'] + scripts_run_as_programs()


def bare_environment():
    """This process's environment as a fresh shell's: no virtual environment active, no .venv on PATH."""
    environ = {k: v for k, v in os.environ.items() if k not in ('VIRTUAL_ENV', 'PYTHONPATH')}
    environ['PATH'] = os.pathsep.join(p for p in environ.get('PATH', '').split(os.pathsep) if '.venv' not in p)
    return environ


def bare_python(*argv, env=None):
    """This interpreter without its site-packages (-S): what a fresh shell's system python3 is to the recipe."""
    base = getattr(sys, '_base_executable', sys.executable)
    return subprocess.run([base, '-S', *argv], cwd=ROOT, capture_output=True, text=True,
                          env=env or bare_environment(), timeout=300)


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, '.venv', 'bin', 'python')),
                    reason='no .venv here (make setup creates it)')
@pytest.mark.parametrize('entry_point', ENTRY_POINTS)
def test_entry_point_finds_the_project_environment(entry_point):
    """... and one that loads MXNet loads it without scikit-learn or SciPy's statistics and sparse matrices
    (rn50/world/cpu.py's load_mxnet: 0.3 s of every start)."""
    environ = dict(bare_environment(), PYTHONPROFILEIMPORTTIME='1')
    result = bare_python(entry_point, '--help', env=environ)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'usage:' in result.stdout
    imported = modules_imported(result.stderr)
    deferred = deferred_by_mxnet(imported)
    assert 'mxnet' not in imported or not deferred, (entry_point, deferred)


def test_without_any_environment_it_says_how_to_set_up(tmp_path):
    """A copy of rn50/launch/interpreter.py in a checkout with no .venv: one error line, no traceback."""
    (tmp_path / 'rn50' / 'launch').mkdir(parents=True)
    (tmp_path / 'rn50' / 'launch' / 'interpreter.py').write_text(
        open(os.path.join(ROOT, 'rn50', 'launch', 'interpreter.py')).read())
    (tmp_path / 'main.py').write_text('from rn50.launch import interpreter\ninterpreter.use_project_python()\n'
                                      'print("ran")\n')
    result = subprocess.run([getattr(sys, '_base_executable', sys.executable), '-S', 'main.py'], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 1 and 'Traceback' not in result.stderr
    assert result.stderr.startswith('error: ') and 'make setup' in result.stderr


def test_the_benchmarks_find_pytorch_where_its_peer_runs():
    """benchmark_training.py measures PyTorch's peer when interpreter.can_import('torch'): PyTorch lives in
    .venv-consumers (make test makes it), never in .venv, and scripts/pytorch_peer.py runs itself there (it used
    to ask .venv alone, and say 'not installed')."""
    import importlib.util
    from rn50.launch import interpreter
    assert importlib.util.find_spec('torch') is None
    assert interpreter.other_environment('torch') == os.path.join(ROOT, '.venv-consumers')
    assert interpreter.can_import('torch') and interpreter.other_environment('mxnet') is None
