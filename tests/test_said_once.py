"""Issue 37, item 9: what the set-up and a run say about themselves. `make setup` keeps pip's conflict report
about the packages installed without their dependencies out of its output (and reports any other conflict);
--aug-repeats with fewer workers than repeats and --tensorboard say in the log what they do."""
import logging
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

import data
from rn50.checkpoints.workspace import Workspace
from rn50.reports import tensorboard_log
from rn50.world import workers
from conftest import ROOT, digits_flags, resolved

pytestmark = pytest.mark.unit


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


def test_repeats_on_fewer_workers_say_where_the_copies_go(digits, caplog):
    args = resolved(digits_flags(digits) + ['--aug-repeats', '4', '--data-backend', 'mxnet'])
    with caplog.at_level(logging.INFO, logger='rn50.data.records'):
        data.RecordLoader.of(args, 0, 1, training=True)
    assert ('--aug-repeats 4 with 1 worker: the 4 copies of an image are dealt over the workers, so up to 4 of them '
            'sit side by side in one worker\'s batch') in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='rn50.data.records'):
        data.RecordLoader.of(args, 0, 4, training=True)       # as many workers as repeats: one copy each
        data.RecordLoader.of(args, 1, 2, training=True)       # rank 1 of 2: rank 0 says it
    assert caplog.text == ''


def test_tensorboard_says_where_its_files_go(tmp_path, caplog):
    args = SimpleNamespace(tensorboard='tb', workspace=str(tmp_path), model_prefix='model')
    with caplog.at_level(logging.INFO, logger='rn50.reports.tensorboard_log'):
        tensorboard_log.teed(Workspace.of(args).place(args.tensorboard), workers.World(), SimpleNamespace(), 4,
                             {'epoch': 0, 'iteration': 0})
    folder = tmp_path / 'tb'
    assert f'--tensorboard: event files in {folder} (view them with: tensorboard --logdir {folder})' in caplog.text
    assert os.listdir(folder)
