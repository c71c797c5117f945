"""runner: the derived train.py command lines of the seed README's commands (without launching), and a
real two-worker CPU run on the demo dataset."""
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

loader = importlib.machinery.SourceFileLoader('runner', os.path.join(ROOT, 'runner'))
spec = importlib.util.spec_from_loader('runner', loader)
runner = importlib.util.module_from_spec(spec)
loader.exec_module(runner)


def command(argv, gpus=0, fused=False):
    """(launch prefix, train.py flags as a dict of last values, raw flag list) for runner argv."""
    args, forwarded = runner.parse_args(argv)
    notes = []
    cmd = runner.launch_prefix(args, gpus) + runner.train_command(args, forwarded, gpus, fused, notes)
    split = cmd.index(os.path.join(ROOT, 'train.py'))
    flags = cmd[split + 1:]
    values = {}
    for i, flag in enumerate(flags):
        if flag.startswith('--'):
            values[flag] = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith('--') else True
    return cmd[:split - 1], values, flags


@pytest.mark.parametrize('n,b,lr', [(8, 192, 1.536), (8, 512, 4.096), (8, 96, 0.768), (1, 512, 0.512)])
def test_global_batch_and_lr_scaling(n, b, lr):
    _, flags, _ = command(['-n', str(n), '-b', str(b)], gpus=8)
    assert int(flags['--batch-size']) == n * b
    assert float(flags['--lr']) == pytest.approx(lr)


def test_seed_readme_training_on_gpus():
    prefix, flags, _ = command(['-n', '8', '-b', '192'], gpus=8, fused=True)
    assert prefix == ['horovodrun', '-np', '8']
    assert flags['--gpus'] == '0,1,2,3,4,5,6,7' and flags['--kv-store'] == 'horovod'
    assert flags['--dtype'] == 'float16' and flags['--image-shape'] == '4,224,224'
    assert (flags['--conv-layout'], flags['--batchnorm-layout'], flags['--pooling-layout']) == ('NHWC',) * 3
    assert flags['--fuse-bn-relu'] == '1' and flags['--fuse-bn-add-relu'] == '1'
    root = runner.DEFAULT_DATA_ROOT
    assert flags['--data-train'] == f'{root}/train.rec' and flags['--data-val-idx'] == f'{root}/val.idx'
    assert '--num-epochs' not in flags and '--data-backend' not in flags


def test_float16_without_fused_kernels_and_mxnet_backend():
    _, flags, _ = command(['-n', '2', '--data-backend', 'mxnet'], gpus=2, fused=False)
    assert flags['--image-shape'] == '3,224,224' and '--fuse-bn-relu' not in flags
    assert flags['--data-backend'] == 'mxnet'


def test_float32_commands_and_forwarding():
    _, flags, raw = command(['-n', '8', '-b', '96', '--dtype', 'float32', '--num-epochs', '250', '--mixup', '0.2',
                             '--data-root', '/d'], gpus=8)
    assert flags['--dtype'] == 'float32' and flags['--image-shape'] == '3,224,224'
    assert '--conv-layout' not in flags and flags['--mixup'] == '0.2'
    assert flags['--num-epochs'] == '250' and flags['--data-train'] == '/d/train.rec'
    _, flags, raw = command(['-e', '5', '--image-shape', '3,32,32', '--num-epochs', '7'])
    assert flags['--image-shape'] == '3,32,32' and flags['--num-epochs'] == '7'   # the last occurrence wins
    assert raw.index('3,224,224') < raw.index('3,32,32')


def test_val_and_pred_commands():
    prefix, flags, _ = command(['-n', '1', '-b', '192', '--load', 'm.params', '--mode', 'val'], gpus=1)
    assert prefix == [] and flags['--mode'] == 'val' and flags['--load'] == 'm.params'
    _, flags, _ = command(['--load', 'm.params', '--mode', 'pred', '--data-pred', 'cat.jpg'], gpus=1)
    assert flags['--data-pred'] == 'cat.jpg' and flags['--batch-size'] == '192'


def test_cpu_machine_defaults():
    prefix, flags, _ = command(['-n', '2', '-b', '32'], gpus=0)
    assert prefix == ['horovodrun', '-np', '2', '--gloo']
    assert '--gpus' not in flags and flags['--dtype'] == 'float32' and flags['--image-shape'] == '3,224,224'


def test_multi_node_and_slurm_launchers():
    prefix, _, _ = command(['-n', '16', '-H', 'host1:8,host2:8'], gpus=8)
    assert prefix == ['horovodrun', '-np', '16', '-H', 'host1:8,host2:8']
    prefix, _, _ = command(['-n', '16', '--hostfile', 'hosts.txt'], gpus=8)
    assert prefix == ['horovodrun', '-np', '16', '--hostfile', 'hosts.txt']
    prefix, flags, _ = command(['-n', '16', '--launcher', 'slurm'], gpus=8)
    assert prefix == [] and int(flags['--batch-size']) == 16 * 192
    prefix, flags, _ = command(['-n', '4', '--kv-store', 'device'], gpus=4)
    assert prefix == [] and flags['--gpus'] == '0,1,2,3' and flags['--kv-store'] == 'device'


def test_environment(monkeypatch):
    args, _ = runner.parse_args(['-n', '2'])
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.setenv('HOROVOD_CYCLE_TIME', '5')
    cpu = runner.environment(args, 0)
    assert cpu['OMP_NUM_THREADS'] == str(max(1, os.cpu_count() // 2))
    assert 'HOROVOD_CYCLE_TIME' not in cpu                 # the user's value wins
    assert 'MXNET_ENABLE_CUDA_GRAPHS' not in cpu and cpu['MXNET_UPDATE_ON_KVSTORE'] == '0'
    gpu = runner.environment(args, 2)
    assert gpu['MXNET_ENABLE_CUDA_GRAPHS'] == '1' and gpu['OMP_NUM_THREADS'] == '1'


def test_dry_run_prints_command():
    result = subprocess.run([sys.executable, os.path.join(ROOT, 'runner'), '-n', '2', '-b', '8', '--dry-run'],
                            capture_output=True, text=True, check=True)
    lines = result.stdout.strip().splitlines()
    assert 'MXNET_UPDATE_ON_KVSTORE=0' in lines and lines[-1].split()[0] == 'horovodrun'


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
def test_two_cpu_workers_train_on_the_demo_dataset(digits, tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'runner'), '-n', '2', '-b', '16', '-e', '1', '--data-root',
         str(digits / 'rec'), '--data-backend', 'dali-cpu', '--image-shape', '3,32,32', '--num-classes', '10',
         '--data-val-resize', '32', '--num-layers', '18', '--num-examples', '256', '--workspace', str(tmp_path),
         '--dali-threads', '1', '--dali-validation-threads', '1'],
        capture_output=True, text=True, env=dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' +
                                                 os.environ['PATH']))
    assert result.returncode == 0, result.stderr[-3000:]
    import logs
    records = logs.read_dllogger(str(tmp_path / 'dllogger_log.log'))
    assert records[0]['data']['batch_size'] == 32 and records[0]['data']['kv_store'] == 'horovod'
    epoch = [r for r in records if r['step'] == [0]][0]['data']
    assert epoch['val.accuracy'] > 0 and (tmp_path / 'model_last.state').exists()
