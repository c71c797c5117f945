"""What a trained workspace carries for its model, and what val, pred and export do with it (issue 56): the class
names kept in classes.json (pred and export with --workspace alone name them; a resumed run must keep them), --load
alone working beside its weights (never in the current folder), weights described (a state from the middle of an
epoch is said to be one), export reading everything before it writes, and saying what it replaced and which
trtexec command builds its engine."""
import json
import os

import pytest

from conftest import TRAINED_NET, copy_workspace, digits_flags, run_mode, runner_runs, train_main

from rn50.checkpoints import resume


def trained_flags(digits):
    return [*digits_flags(digits, batch=32), *TRAINED_NET]


@pytest.mark.integration
def test_pred_and_export_on_a_workspace_alone_name_its_classes(digits, trained_digits, tmp_path):
    """The runner without --data-root (its default folder does not exist here): pred names the classes from the
    workspace's classes.json, export writes a Triton repository labelled with them and compares onnxruntime with
    nothing (said), instead of failing on missing validation data after writing."""
    workspace = copy_workspace(trained_digits, tmp_path / 'run')
    assert json.loads((workspace / 'classes.json').read_text())['classes'][3] == {'index': 3, 'name': 'three'}
    image = digits / 'images' / 'val' / 'digit_3' / '0659.jpg'
    pred = runner_runs('--mode', 'pred', '--workspace', workspace, '--data-pred', image, '--pred-output',
                       tmp_path / 'pred.json')
    assert pred.returncode == 0, pred.stderr[-2000:]
    top = json.loads((tmp_path / 'pred.json').read_text())['predictions'][0]['top']
    assert {t['name'] for t in top} <= {'zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight',
                                        'nine'}
    export = runner_runs('--mode', 'export', '--workspace', workspace, '--triton', tmp_path / 'triton')
    assert export.returncode == 0, export.stderr[-2000:]
    assert 'No validation data: the ONNX model is checked by onnx.checker alone' in export.stderr
    assert (tmp_path / 'triton' / 'model' / 'labels.txt').read_text().split('\n')[:3] == ['zero', 'one', 'two']


@pytest.mark.integration
def test_export_reads_the_validation_data_before_it_writes_anything(digits, trained_digits, tmp_path):
    workspace = copy_workspace(trained_digits, tmp_path / 'run')
    missing = tmp_path / 'nowhere' / 'val.rec'
    result = train_main(*trained_flags(digits), '--workspace', workspace, '--mode', 'export', '--data-val', missing,
                        '--triton', tmp_path / 'triton')
    assert result.returncode == 2 and f"validation data '{missing}' not found" in result.stderr
    assert not (workspace / 'export').exists() and not (tmp_path / 'triton').exists()


@pytest.mark.integration
def test_load_alone_works_beside_its_weights_not_in_the_current_folder(digits, trained_digits, tmp_path,
                                                                       monkeypatch):
    weights = copy_workspace(trained_digits, tmp_path / 'weights')
    here = tmp_path / 'here'
    here.mkdir()
    monkeypatch.chdir(here)
    result = train_main('--mode', 'pred', '--load', weights / 'model_best.params', '--data-pred',
                        digits / 'images' / 'val' / 'digit_0', '--pred-output', tmp_path / 'pred.json')
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.listdir(here) == []
    assert f'Logs and reports in {weights}, the folder of --load\'s weights' in (weights / 'log.log').read_text()
    names = {t['name'] for p in json.loads((tmp_path / 'pred.json').read_text())['predictions'] for t in p['top']}
    assert 'zero' in names and not any(name.startswith('class ') for name in names)


@pytest.mark.integration
def test_a_resumed_run_keeps_its_class_names(digits, tmp_path):
    names = tmp_path / 'names.txt'
    names.write_text('\n'.join(f'digit {n}' for n in range(10)))
    first = ['--num-layers', '10', '--image-shape', '3,24,24', '--data-val-resize', '28', '--num-epochs', '2',
             '--run-epochs', '1', '--num-examples', '32', '--no-review', '--workspace', tmp_path / 'run']
    run_mode(*digits_flags(digits), *first, '--classes', names)
    assert json.loads((tmp_path / 'run' / 'classes.json').read_text())['classes'][9]['name'] == 'digit 9'
    other = run_mode(*digits_flags(digits), *first, check=False)      # the dataset's names: zero, one, ...
    assert other.returncode == 2
    assert "names other classes than this run (class 0 is 'digit 0' there, 'zero' in " in other.stderr
    run_mode(*digits_flags(digits), *first, '--classes', names)      # the same names: it continues


@pytest.mark.integration
def test_weights_from_the_middle_of_an_epoch_are_said_to_be(digits, tmp_path, monkeypatch):
    """A run stopped after its first step (a signal): pred and export of its state say epoch 0, iteration 1, not
    a finished epoch, in the log (a warning), pred's JSON and report_export.json."""
    import train
    from rn50.launch.stop import StopRequest

    class StoppedAtOnce(StopRequest):
        def __init__(self):
            super().__init__()
            self.requested = True
    workspace = tmp_path / 'run'
    flags = [*digits_flags(digits), '--num-layers', '10', '--image-shape', '3,24,24', '--data-val-resize', '28',
             '--workspace', workspace]
    monkeypatch.setattr(train, 'StopRequest', StoppedAtOnce)
    run_mode(*flags, '--num-epochs', '2', '--num-examples', '64')
    monkeypatch.undo()
    pred = run_mode(*flags, '--mode', 'pred', '--data-pred', digits / 'images' / 'val' / 'digit_0' / '1687.jpg',
                    '--pred-output', tmp_path / 'pred.json')
    assert 'These weights are not a finished epoch: the run stopped 1 iterations into epoch 0 (0 of 2 epochs ' \
           'done)' in pred.stderr
    trained = json.loads((tmp_path / 'pred.json').read_text())['trained']
    assert (trained['kind'], trained['epoch'], trained['iteration'], trained['epochs'], trained['finished']) == \
        ('state', 0, 1, 2, False)
    run_mode(*flags, '--mode', 'export')
    report = json.loads((workspace / 'report_export.json').read_text())['summary']
    assert report['trained']['finished'] is False and report['trained']['iteration'] == 1


@pytest.mark.unit
def test_weights_are_described_from_their_file_and_their_run(tmp_path):
    (tmp_path / 'report.json').write_text(json.dumps({'config': {'num_epochs': 15}, 'epochs': [
        {'epoch': 0, 'val.accuracy': 0.5}, {'epoch': 1, 'val.accuracy': 0.9}, {'epoch': 2, 'val.accuracy': 0.8}]}))
    best = resume.describe_weights(str(tmp_path / 'model_best.params'))
    assert (best.kind, best.epoch, best.epochs, best.accuracy, best.finished) == ('best', 2, 15, 0.9, True)
    assert best.words == 'the best validated weights, after 2 of 15 epochs (top-1 0.9000)'
    assert resume.describe_weights(str(tmp_path / 'model_0004.params')).words == 'the weights after 5 of 15 epochs'
    assert resume.describe_weights('/elsewhere/resnet50.safetensors').kind == 'weights'


@pytest.mark.integration
def test_export_gives_its_trtexec_command_and_says_what_it_replaced(digits, trained_digits, tmp_path):
    workspace = copy_workspace(trained_digits, tmp_path / 'run')
    flags = [*trained_flags(digits), '--workspace', workspace, '--mode', 'export']
    first = run_mode(*flags, '--batch-size', '16')
    onnx = workspace / 'export' / 'model.onnx'
    command = (f'trtexec --onnx={onnx} --saveEngine={workspace / "export" / "model.plan"} --fp16 '
               '--minShapes=data:1x3x24x24 --optShapes=data:16x3x24x24 --maxShapes=data:16x3x24x24')
    summary = json.loads((workspace / 'report_export.json').read_text())['summary']
    assert summary['tensorrt'] == command and command in first.stderr and summary['replaced'] is None
    second = run_mode(*flags, '--val-image-shape', '3,32,32', '--data-val-resize', '37')
    assert f'Replacing the export in {workspace / "export"} made for 24x24 (resize 28, linear) by this one for ' \
           '32x32 (resize 37, linear)' in second.stderr
    summary = json.loads((workspace / 'report_export.json').read_text())['summary']
    assert summary['replaced']['size'] == [24, 24] and summary['preprocessing']['size'] == [32, 32]
