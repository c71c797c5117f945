"""val, pred and export take the image size, validation resize and class count of the run that trained their
weights (trained_settings.py): a model trained at 24x24 after a 28 resize is validated, asked and exported so,
and a contradicting flag is one error line. The trained workspaces are conftest's, copied."""
import json

import pytest

from conftest import (TRAINED_NET, TRAINED_RUN, apart_data_flags, copy_workspace, digits_flags, run_mode,
                      train_main)

pytestmark = pytest.mark.integration

# Two validations of the same weights may round one near tie differently (another process, another plan of
# oneDNN's kernels): a top-1 is compared within one of the 359 validation digits.
ONE_IMAGE = 1.01 / 359

TINY = ['--seed', '3', '--batch-size', '32', '--data-backend', 'mxnet',
        '--data-mxnet-threads', '2']


def train_py(*argv):
    return run_mode(*TINY, *argv, check=False)


@pytest.fixture
def trained(trained_digits, digits, tmp_path):
    """A copy of conftest's trained_digits, a ResNet-10 trained 3 epochs at 3,24,24 with --data-val-resize 28 (the
    tests validate, export and continue it in place), and the digits' data flags."""
    return copy_workspace(trained_digits, tmp_path / 'trained'), apart_data_flags(digits)


def test_val_pred_and_export_take_the_trained_size(trained, digits, tmp_path):
    workspace, data = trained
    trained_top1 = max(epoch['val.accuracy'] for epoch in json.loads((workspace / 'report.json').read_text())['epochs'])
    val = train_py(*data, '--mode', 'val', '--workspace', workspace)
    assert val.returncode == 0, val.stderr[-3000:]
    log = (workspace / 'log.log').read_text()
    assert 'Taken from the run that trained' in log
    assert '--image-shape 3,24,24, --num-layers 10, --data-val-resize 28' in log
    # the same weights and preprocessing as the run's own validation: the same top-1 (it was 0.1 at 224x224)
    assert json.loads((workspace / 'report_val.json').read_text())['summary']['val.accuracy'] == \
        pytest.approx(trained_top1, abs=ONE_IMAGE)
    export = train_py('--mode', 'export', '--workspace', workspace, '--data-backend', 'synthetic')
    assert export.returncode == 0, export.stderr[-3000:]
    import onnx
    model = onnx.load(str(workspace / 'export' / 'model.onnx'))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == [3, 24, 24]


def recorded_settings(state, **settings):
    """Rewrite the settings `state` (a .state file) records, its checksum made anew: a run trained so."""
    import mxnet as mx
    from rn50.checkpoints import checkpoint
    arrays = mx.nd.load(str(state))
    meta = json.loads(arrays.pop('meta').asnumpy().tobytes().decode())
    meta['settings'].update(settings)
    arrays['meta'] = checkpoint.bytes_array(json.dumps(meta).encode())
    arrays['checksum'] = checkpoint.bytes_array(checkpoint.checksum(arrays).encode())
    mx.nd.save(str(state), arrays)


def test_val_takes_the_run_s_batchnorm_epsilon_and_groups(trained):
    """A run trained with --batchnorm-eps 0.001 is validated, asked and exported with it (the default 1e-5 would
    normalise every layer otherwise, silently: it was not recorded); --num-groups likewise (a ResNeXt's); a
    command that gives another epsilon is refused."""
    from conftest import resolved
    from rn50.errors import RecipeError
    workspace, data = trained
    recorded_settings(workspace / 'model_last.state', batchnorm_eps=0.001, num_groups=16)
    command = [str(flag) for flag in (*TINY, *data, '--mode', 'val', '--workspace', workspace)]
    args = resolved(command)
    assert (args.batchnorm_eps, args.num_groups, args.num_layers) == (0.001, 16, 10)
    with pytest.raises(RecipeError, match=r'--batchnorm-eps 1e-05 \(trained with 0.001\)'):
        resolved(command + ['--batchnorm-eps', '1e-5'])


def test_a_contradicting_flag_is_one_error(trained):
    workspace, data = trained
    result = train_main(*TINY, *data, '--mode', 'val', '--workspace', workspace, '--image-shape', '3,64,64')
    assert result.returncode == 2 and result.stderr.count('error:') == 1
    assert 'was trained with other settings than this command gives: --image-shape 3,64,64 (trained at 24x24)' \
        in result.stderr


def test_a_finished_run_continued_in_a_new_workspace_has_its_own_best_and_says_which(trained, digits, tmp_path):
    """-e 4 over a finished 3-epoch run: the error names the --load way; continued so (one more epoch, of 256
    images), the new workspace gets a model_best.params of its own epochs (the inherited best was never beaten,
    so there was none and pred took the last state without a word), the summary says the epoch of each figure,
    pred names its weights."""
    workspace, data = trained
    command = [*digits_flags(digits, batch=32), *TRAINED_NET, *TRAINED_RUN, '--num-epochs', '4']
    again = train_main(*command, '--workspace', workspace)          # refused before training: in process
    assert again.returncode == 2 and f'--load {workspace / "model_last.state"} --workspace NEW_FOLDER' in again.stderr
    new = tmp_path / 'continued'
    run_mode(*command, '--num-examples', '256', '--workspace', new, '--load', workspace / 'model_last.state')
    assert (new / 'model_best.params').exists() and 'Continuing the run of' in (new / 'log.log').read_text()
    summary = json.loads((new / 'report.json').read_text())['summary']
    assert summary['val.accuracy.epoch'] in (2, 3) and summary['train.loss.epoch'] in (2, 3)
    pred = train_py('--mode', 'pred', '--workspace', new, '--data-pred', data[1].parent.parent / 'images' / 'val')
    assert pred.returncode == 0, pred.stderr[-3000:]
    assert f'Weights: {new / "model_best.params"} (the best validated weights of the workspace)' in \
        (new / 'log.log').read_text()


def test_trained_at_one_size_and_tested_at_another(digits, trained_apart, tmp_path):
    """--image-shape 3,32,32 --val-image-shape 3,40,40 --data-val-resize 46 (conftest's trained_apart, copied):
    validation during training, --mode val, pred and export all test at 40x40 (taken from the run); the top-1 of
    --mode val is the run's own."""
    data = apart_data_flags(digits)
    workspace = copy_workspace(trained_apart, tmp_path / 'apart')
    trained_top1 = json.loads((workspace / 'report.json').read_text())['epochs'][-1]['val.accuracy']
    val = train_py(*data, '--mode', 'val', '--workspace', workspace)
    assert val.returncode == 0, val.stderr[-3000:]
    assert '--val-image-shape 3,40,40' in (workspace / 'log.log').read_text()
    assert json.loads((workspace / 'report_val.json').read_text())['summary']['val.accuracy'] == \
        pytest.approx(trained_top1, abs=ONE_IMAGE)
    pred = train_py(*data, '--mode', 'pred', '--workspace', workspace, '--data-pred',
                    digits / 'images' / 'val' / 'digit_3')
    assert pred.returncode == 0 and '1. ' in pred.stdout, pred.stderr[-3000:]
    export = train_py('--mode', 'export', '--workspace', workspace, '--data-backend', 'synthetic')
    assert export.returncode == 0, export.stderr[-3000:]
    import onnx
    model = onnx.load(str(workspace / 'export' / 'model.onnx'))
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:] == [3, 40, 40]
