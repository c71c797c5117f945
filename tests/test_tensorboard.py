"""tensorboard_log.py (--tensorboard): the flag's folder in the workspace, the log line saying where the event files
go, the scalars on disk when their record is logged (no writer thread), and a Horovod worker that loads its writer
before horovod.mxnet."""
import logging
import os
import shutil
import threading
from types import SimpleNamespace

import pytest

from rn50.checkpoints.workspace import Workspace
from rn50.reports import tensorboard_log
import train
from rn50.world import workers
from conftest import run_script, scalars


@pytest.mark.unit
def test_tensorboard_flag_defaults_to_the_workspace_folder():
    parser = train.build_parser()
    assert parser.parse_args(['--tensorboard']).tensorboard == 'tensorboard'
    assert parser.parse_args(['--tensorboard', 'tb']).tensorboard == 'tb'
    assert parser.parse_args([]).tensorboard is None


@pytest.mark.unit
def test_tensorboard_says_where_its_files_go(tmp_path, caplog):
    args = SimpleNamespace(tensorboard='tb', workspace=str(tmp_path), model_prefix='model')
    with caplog.at_level(logging.INFO, logger='rn50.reports.tensorboard_log'):
        tensorboard_log.teed(Workspace.of(args).place(args.tensorboard), workers.World(), SimpleNamespace(), 4,
                             0)
    folder = tmp_path / 'tb'
    assert f'--tensorboard: event files in {folder} (view them with: tensorboard --logdir {folder})' in caplog.text
    assert os.listdir(folder)


class RecordsOnly:
    def __init__(self):
        self.records = []

    def log(self, step, data, note=''):
        self.records.append((step, data))


# A stand-in for PyTorch that fails where the real one crashes: imported after horovod.mxnet.
TORCH_AFTER_HOROVOD_FAILS = """import sys
if 'horovod.mxnet' in sys.modules:
    raise RuntimeError('torch imported after horovod.mxnet: the real one segfaults there')
Tensor = type('Tensor', (), {})
"""


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.integration
def test_tensorboard_on_a_horovod_worker_loads_its_writer_before_horovod(tmp_path):
    """tensorboardX imports PyTorch wherever it is installed, and PyTorch imported after horovod.mxnet crashed the
    process (torch 2.14.1, Horovod 0.28.1): every runner launch with --tensorboard is a Horovod worker. With the
    stand-in `torch` above on the path, a one-worker Horovod run writes its event file."""
    (tmp_path / 'path' / 'torch').mkdir(parents=True)
    (tmp_path / 'path' / 'torch' / '__init__.py').write_text(TORCH_AFTER_HOROVOD_FAILS)
    result = run_script('train.py', '--data-backend', 'synthetic', '--num-layers', '10', '--image-shape', '3,32,32',
                        '--num-classes', '10', '--num-examples', '32', '--batch-size', '16', '--num-epochs', '1',
                        '--mode', 'train', '--kv-store', 'horovod', '--tensorboard', '--workspace', tmp_path / 'ws',
                        check=False, env=dict(os.environ, PYTHONPATH=str(tmp_path / 'path')))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(os.listdir(tmp_path / 'ws' / 'tensorboard')) == 1


@pytest.mark.unit
def test_tensorboard_scalars_are_on_disk_when_the_record_is_logged(tmp_path):
    """No writer thread between a record and the file: tensorboardX's SummaryWriter queued events for one, and
    its flush() wrote only what the thread had taken, so a run killed right after an epoch's validation once
    lost that epoch's val/ scalars (tests/test_fit.py's kill test with every feature)."""
    args = SimpleNamespace(tensorboard=str(tmp_path / 'tb'), workspace=str(tmp_path), model_prefix='model')
    threads = set(threading.enumerate())
    dllogger = RecordsOnly()
    logger = tensorboard_log.teed(Workspace.of(args).place(args.tensorboard), workers.World(), dllogger, 4,
                                  0)
    logger.log((0, 2), {'train.loss': 1.5, 'train.lr': 0.1})
    logger.log((0,), {'val.accuracy': 0.5, 'val.ips': 900.0})
    assert set(threading.enumerate()) <= threads      # no thread started (others' may have ended)
    assert scalars(tmp_path / 'tb') == {'train/loss': [(2, 1.5)], 'train/lr': [(2, 0.1)], 'val/accuracy': [(4, 0.5)]}
    assert len(dllogger.records) == 2
