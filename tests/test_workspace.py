"""workspace.py: the names of the files a run writes in its workspace (those resume, val, pred, export and the
fault tools look for), the placing of a flag's output path, and --keep-checkpoints' pruning."""
import argparse

import pytest

from rn50.checkpoints.workspace import Workspace

pytestmark = pytest.mark.unit


def test_the_workspace_names_its_files_as_the_recipe_always_has():
    ws = Workspace.of(argparse.Namespace(workspace='runs/a', model_prefix='net'))
    assert (ws.last_state, ws.previous_state, ws.best_params, ws.ema_best_params, ws.epoch_params(7)) == \
        ('runs/a/net_last.state', 'runs/a/net_prev.state', 'runs/a/net_best.params', 'runs/a/net_ema_best.params',
         'runs/a/net_0007.params')
    assert (ws.int8_prefix, ws.export_folder) == ('runs/a/net_int8', 'runs/a/export')
    assert (ws.report('train'), ws.report('train_val'), ws.report('val'), ws.report('export')) == \
        ('runs/a/report.json', 'runs/a/report.json', 'runs/a/report_val.json', 'runs/a/report_export.json')


def test_a_flags_relative_path_goes_in_the_workspace_and_an_absolute_one_stays():
    ws = Workspace('runs/a', 'net')
    assert (ws.place('log.log'), ws.place('tb/x'), ws.place('/tmp/log.log')) == \
        ('runs/a/log.log', 'runs/a/tb/x', '/tmp/log.log')


def test_keep_checkpoints_prunes_the_oldest_epoch_params_of_its_prefix_only(tmp_path):
    ws = Workspace(str(tmp_path), 'net')
    for epoch in (1, 2, 3, 10):
        (tmp_path / f'net_{epoch:04d}.params').write_bytes(b'x')
    (tmp_path / 'other_0001.params').write_bytes(b'x')
    ws.prune_epoch_params(0)                  # --keep-checkpoints 0 keeps all
    assert len(list(tmp_path.iterdir())) == 5
    ws.prune_epoch_params(2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['net_0003.params', 'net_0010.params', 'other_0001.params']
