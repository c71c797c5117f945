"""runner: the derived train.py command lines of the seed README's commands (without launching), per-node
GPU ids, flag ranges and user errors reported once, and real two-worker CPU runs on the demo dataset (training,
a worker's user error, SIGTERM / SIGUSR1 through the runner, resume)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import (ROOT, deferred_by_mxnet, horovod_says, modules_imported, report_gpus, run_mode, runner_main,
                      runner_module)

runner = runner_module()


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
@pytest.mark.unit
def test_global_batch_and_lr_scaling(n, b, lr):
    _, flags, _ = command(['-n', str(n), '-b', str(b)], gpus=8)
    assert int(flags['--batch-size']) == n * b
    assert float(flags['--lr']) == pytest.approx(lr)


@pytest.mark.unit
def test_runner_scales_the_learning_rate_by_the_effective_batch():
    def lr(*argv):
        result = runner_main('--dry-run', '--data-backend', 'synthetic', *argv)
        assert result.returncode == 0, result.stderr
        words = result.stdout.split()
        return float(words[words.index('--lr') + 1])
    assert lr('-n', '1', '-b', '192', '--grad-accum-steps', '8') == lr('-n', '8', '-b', '192') == 1.536


@pytest.mark.unit
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


@pytest.mark.unit
def test_float16_without_fused_kernels_and_mxnet_backend():
    _, flags, _ = command(['-n', '2', '--data-backend', 'mxnet'], gpus=2, fused=False)
    assert flags['--image-shape'] == '3,224,224' and '--fuse-bn-relu' not in flags
    assert flags['--data-backend'] == 'mxnet'


@pytest.mark.unit
def test_float32_commands_and_forwarding():
    _, flags, raw = command(['-n', '8', '-b', '96', '--dtype', 'float32', '--num-epochs', '250', '--mixup', '0.2',
                             '--data-root', '/d'], gpus=8)
    assert flags['--dtype'] == 'float32' and flags['--image-shape'] == '3,224,224'
    assert '--conv-layout' not in flags and flags['--mixup'] == '0.2'
    assert flags['--num-epochs'] == '250' and flags['--data-train'] == '/d/train.rec'
    _, flags, raw = command(['-e', '5', '--image-shape', '3,32,32', '--num-epochs', '7'])
    assert flags['--image-shape'] == '3,32,32' and flags['--num-epochs'] == '7'   # the last occurrence wins
    assert raw.index('3,224,224') < raw.index('3,32,32')


@pytest.mark.unit
def test_val_and_pred_commands():
    prefix, flags, _ = command(['-n', '1', '-b', '192', '--load', 'm.params', '--mode', 'val'], gpus=1)
    assert prefix == [] and flags['--mode'] == 'val' and flags['--load'] == 'm.params'
    _, flags, _ = command(['--load', 'm.params', '--mode', 'pred', '--data-pred', 'cat.jpg'], gpus=1)
    assert flags['--data-pred'] == 'cat.jpg' and flags['--batch-size'] == '192'


@pytest.mark.unit
def test_cpu_machine_defaults():
    prefix, flags, _ = command(['-n', '2', '-b', '32'], gpus=0)
    assert prefix == ['horovodrun', '-np', '2', '--gloo']
    assert '--gpus' not in flags and flags['--dtype'] == 'float32' and flags['--image-shape'] == '3,224,224'


@pytest.mark.unit
def test_multi_node_and_slurm_launchers():
    prefix, _, _ = command(['-n', '16', '-H', 'host1:8,host2:8'], gpus=8)
    assert prefix == ['horovodrun', '-np', '16', '-H', 'host1:8,host2:8']
    prefix, _, _ = command(['-n', '16', '--hostfile', 'hosts.txt'], gpus=8)
    assert prefix == ['horovodrun', '-np', '16', '--hostfile', 'hosts.txt']
    prefix, flags, _ = command(['-n', '16', '--launcher', 'slurm'], gpus=8)
    assert prefix == [] and int(flags['--batch-size']) == 16 * 192
    prefix, flags, _ = command(['-n', '4', '--kv-store', 'device'], gpus=4)
    assert prefix == [] and flags['--gpus'] == '0,1,2,3' and flags['--kv-store'] == 'device'


@pytest.mark.unit
def test_environment(monkeypatch):
    """GPU runs get the original runner's engine variables; CPU runs none: measured on the CPU, none helped and
    MXNET_OPTIMIZER_AGGREGATION_SIZE=60 cost 5-24% of ResNet-50's step at 32x32 (docs/performance.md). Each
    CPU worker takes its share of the node's cores itself (cpu.prepare_process, tests/test_cpu.py)."""
    args, _ = runner.parse_args(['-n', '2'])
    for name in ('OMP_NUM_THREADS', 'HOROVOD_FUSION_THRESHOLD', 'MXNET_OPTIMIZER_AGGREGATION_SIZE'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('HOROVOD_CYCLE_TIME', '5')
    assert runner.environment(args, 0) == {'RN50_WORKERS': '2'}
    gpu = runner.environment(args, 2)
    assert gpu['MXNET_ENABLE_CUDA_GRAPHS'] == '1' and gpu['OMP_NUM_THREADS'] == '1'
    assert gpu['MXNET_OPTIMIZER_AGGREGATION_SIZE'] == '60' and gpu['HOROVOD_FUSION_THRESHOLD'] == '67108864'
    assert 'HOROVOD_CYCLE_TIME' not in gpu                 # the user's value wins


@pytest.mark.unit
def test_horovod_cycles_fast_only_for_gpus(monkeypatch):
    """HOROVOD_CYCLE_TIME=0.1 (the original runner's, for GPUs, whose host cores idle) keeps Horovod's background
    thread at 42% of a core per worker: on a CPU, whose cores train, 2 workers on 2 cores trained 15% slower
    (104 against 122 images/s). CPU runs take Horovod's default (1 ms, 6% of a core when idle)."""
    monkeypatch.delenv('HOROVOD_CYCLE_TIME', raising=False)
    args, _ = runner.parse_args(['-n', '2'])
    assert 'HOROVOD_CYCLE_TIME' not in runner.environment(args, 0)
    assert runner.environment(args, 2)['HOROVOD_CYCLE_TIME'] == '0.1'


@pytest.mark.unit
def test_dry_run_prints_command():
    result = runner_main('-n', '2', '-b', '8', '--dry-run')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert 'RN50_WORKERS=2' in lines and lines[-1].split()[0] == 'horovodrun'


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.multiworker
def test_two_cpu_workers_on_one_node_and_on_two_nodes_train_alike(digits, tmp_path):
    """Two workers on this machine, then the same two as two "nodes": horovodrun takes localhost and
    127.0.0.1 for two hosts, so each worker has local rank 0 (the multi-node path, per-node GPU ids) and the
    run must follow the one-node run."""
    epochs = []
    for name, hosts in (('one', []), ('two', ['-H', 'localhost:1,127.0.0.1:1'])):
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, 'runner'), '-n', '2', '-b', '16', '-e', '1', *hosts, '--data-root',
             str(digits / 'rec'), '--data-backend', 'dali-cpu', '--image-shape', '3,32,32', '--num-classes', '10',
             '--data-val-resize', '32', '--num-layers', '10', '--num-examples', '64', '--seed', '5',
             '--workspace', str(tmp_path / name), '--dali-threads', '1', '--dali-validation-threads', '1'],
            capture_output=True, text=True, env=dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' +
                                                     os.environ['PATH']))
        assert result.returncode == 0, result.stderr[-3000:]
        # each worker on a device of its own (cpu(local rank), as gpu(local rank)), holding the same model
        assert 'All 2 workers hold the same weights, batchnorm statistics and optimizer state' in result.stderr
        from rn50.reports import logs
        records = logs.read_dllogger(str(tmp_path / name / 'dllogger_log.log'))
        assert records[0]['data']['batch_size'] == 32 and records[0]['data']['kv_store'] == 'horovod'
        epoch = [r for r in records if r['step'] == [0]][0]['data']
        assert epoch['val.accuracy'] > 0 and (tmp_path / name / 'model_last.state').exists()
        epochs.append(logs.without_timings(epoch))
    assert epochs[1] == pytest.approx(epochs[0], rel=1e-6)
    # The top-1 and loss the 2 workers reported are those of the weights they saved, validated in one process
    # (before the statistics were averaged, each worker validated its shard with its own: one image and 0.1%
    # of the loss apart here).
    run_mode('--mode', 'val', '--workspace', tmp_path / 'one', '--data-val', digits / 'rec' / 'val.rec',
             '--data-val-idx', digits / 'rec' / 'val.idx', '--data-backend', 'dali-cpu', '--batch-size', '32')
    alone = json.loads((tmp_path / 'one' / 'report_val.json').read_text())['summary']
    assert abs(alone['val.accuracy'] - epochs[0]['val.accuracy']) * 359 < 1.01
    assert alone['val.loss'] == pytest.approx(epochs[0]['val.loss'], rel=1e-4)


# --------------------------------------------------------------------------------------------------------
# Flag ranges, per-node GPU ids, user errors once

HOROVOD = pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
RUN_ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' + os.environ['PATH'])


@pytest.mark.parametrize('argv', [['-n', '0'], ['-n', '-2'], ['-l', '-1'], ['-l', '0'], ['-l', 'nan'], ['-b', '0'],
                                  ['-e', '0'], ['--stop-timeout', '0']])
@pytest.mark.unit
def test_numeric_flags_are_range_checked_at_parse_time(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        runner.parse_args(argv)
    assert exit_.value.code == 2 and 'error:' in capsys.readouterr().err


def dry_run(monkeypatch, capsys, argv, gpus=8, fused=True):
    """(exit status, train.py flags as a dict of last values, stderr) of `runner --dry-run argv` with MXNet
    made to report `gpus` GPUs."""
    report_gpus(monkeypatch, gpus, fused)
    code = runner.main(argv + ['--dry-run'])
    out, err = capsys.readouterr()
    if code:
        return code, {}, err
    flags = out.strip().splitlines()[-1].split()
    values = {flag: flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag.startswith('--')}
    return code, values, err


@pytest.mark.parametrize('fused', [False, True])
@pytest.mark.parametrize('argv,env,prefix', [
    (['-n', '8', '-b', '192'], {}, 'horovodrun -np 8 '),
    (['-n', '16', '-H', 'localhost:8,b:8'], {}, 'horovodrun -np 16 -H localhost:8,b:8 '),   # this node among them
    (['-n', '16', '--launcher', 'slurm'], {'SLURM_NTASKS': '16', 'SLURM_NTASKS_PER_NODE': '8'}, sys.executable)])
@pytest.mark.unit
def test_the_whole_gpu_plan_with_mxnet_reporting_gpus(monkeypatch, capsys, argv, env, prefix, fused):
    """The runner's GPU branch end to end (main, --dry-run) with nothing of the runner mocked: MXNet reports 8
    GPUs, with or without NVIDIA's fused kernels. It used to end in an AttributeError (the probe of the fused
    kernels had moved from models.py to layers.py)."""
    for name in SLURM_PLAN + ('OMP_NUM_THREADS', 'MXNET_ASYNC_GPU_ENGINE', 'MXNET_ENABLE_CUDA_GRAPHS'):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report_gpus(monkeypatch, 8, fused)
    assert runner.main(argv + ['--dry-run']) == 0
    out, err = capsys.readouterr()
    *variables, line = out.strip().splitlines()
    assert line.startswith(prefix)
    words = line.split()
    flags = {flag: words[i + 1] for i, flag in enumerate(words[:-1]) if flag.startswith('--')}
    assert flags['--gpus'] == '0,1,2,3,4,5,6,7' and flags['--dtype'] == 'float16'
    assert flags['--batch-size'] == str(192 * int(argv[1])) and flags['--image-shape'] == '4,224,224'
    assert (flags['--conv-layout'], flags['--batchnorm-layout'], flags['--pooling-layout']) == ('NHWC',) * 3
    assert (flags.get('--fuse-bn-relu'), flags.get('--fuse-bn-add-relu')) == (('1', '1') if fused else (None, None))
    assert fused or 'no NVIDIA fused batchnorm kernels' in err
    assert {'MXNET_ASYNC_GPU_ENGINE=1', 'MXNET_ENABLE_CUDA_GRAPHS=1', 'OMP_NUM_THREADS=1',
            f'RN50_WORKERS={argv[1]}'} <= set(variables)


@pytest.mark.unit
def test_gpu_ids_are_per_node(monkeypatch, capsys, tmp_path):
    for name in ('SLURM_NTASKS_PER_NODE', 'SLURM_TASKS_PER_NODE', 'SLURM_LOCALID'):
        monkeypatch.delenv(name, raising=False)
    eight = '0,1,2,3,4,5,6,7'
    code, flags, _ = dry_run(monkeypatch, capsys, ['-n', '16', '-H', 'a:8,b:8'])
    assert code == 0 and flags['--gpus'] == eight and flags['--batch-size'] == str(16 * 192)
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('a slots=8\nb slots=8\n')
    assert dry_run(monkeypatch, capsys, ['-n', '16', '--hostfile', str(hostfile)])[1]['--gpus'] == eight
    assert dry_run(monkeypatch, capsys, ['-n', '12', '-H', 'a:4,b:4,c:4'])[1]['--gpus'] == '0,1,2,3'
    assert dry_run(monkeypatch, capsys, ['-n', '4'])[1]['--gpus'] == '0,1,2,3'
    monkeypatch.setenv('SLURM_NTASKS_PER_NODE', '8')
    assert dry_run(monkeypatch, capsys, ['-n', '16', '--launcher', 'slurm'])[1]['--gpus'] == eight
    monkeypatch.delenv('SLURM_NTASKS_PER_NODE')
    monkeypatch.setenv('SLURM_TASKS_PER_NODE', '4(x3),2')
    assert dry_run(monkeypatch, capsys, ['-n', '14', '--launcher', 'slurm'])[1]['--gpus'] == '0,1,2,3'
    monkeypatch.delenv('SLURM_TASKS_PER_NODE')
    monkeypatch.setenv('SLURM_LOCALID', '3')   # SLURM says nothing more: this node's GPUs
    assert dry_run(monkeypatch, capsys, ['-n', '16', '--launcher', 'slurm'])[1]['--gpus'] == eight


@pytest.mark.unit
def test_a_launch_from_a_machine_without_gpus_plans_for_the_workers_nodes(monkeypatch, capsys):
    """A login node has no GPU: the plan used to be float32 on the CPU (no --gpus, Gloo) for GPU workers."""
    code, _, err = dry_run(monkeypatch, capsys, ['-n', '16', '-H', 'node1:8,node2:8'], gpus=0)
    assert code == 2 and 'this machine has no GPU but the workers run on node1, node2' in err
    assert '--gpus-per-node' in err
    code, flags, _ = dry_run(monkeypatch, capsys, ['-n', '16', '-H', 'node1:8,node2:8', '--gpus-per-node', '8'],
                             gpus=0)
    assert code == 0 and flags['--dtype'] == 'float16' and flags['--gpus'] == '0,1,2,3,4,5,6,7'
    assert flags['--conv-layout'] == 'NHWC'
    assert runner.main(['-n', '16', '-H', 'node1:8,node2:8', '--gpus-per-node', '8', '--dry-run']) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith('horovodrun -np 16 -H node1:8,node2:8 ')   # NCCL
    # this machine's own names (the CPU twin of two nodes) need no --gpus-per-node
    code, flags, _ = dry_run(monkeypatch, capsys, ['-n', '2', '-H', 'localhost:1,127.0.0.1:1'], gpus=0)
    assert code == 0 and flags['--dtype'] == 'float32' and '--gpus' not in flags


@pytest.mark.unit
def test_a_login_node_plans_for_the_nodes_and_says_what_it_takes_on_trust(monkeypatch, capsys):
    """From a machine without GPUs onto other nodes, dali-gpu was refused ("this machine has none"), and
    --auto-augment and the fused kernels were judged by this machine's DALI and MXNet. Now the plan is the nodes',
    and what only they can answer is named: their workers check it before the first step."""
    from test_augment import OldDali
    monkeypatch.setitem(sys.modules, 'nvidia.dali', OldDali('1.18.0'))       # this machine's DALI: too old
    monkeypatch.setitem(sys.modules, 'nvidia.dali.auto_aug', None)
    argv = ['-n', '16', '-H', 'node1:8,node2:8', '--gpus-per-node', '8', '--data-backend', 'dali-gpu',
            '--auto-augment', 'ta_wide']
    code, flags, err = dry_run(monkeypatch, capsys, argv, gpus=0, fused=False)
    assert code == 0, err
    assert flags['--data-backend'] == 'dali-gpu' and flags['--fuse-bn-relu'] == flags['--fuse-bn-add-relu'] == '1'
    assert err.strip() == (
        'runner: planned for the nodes of -H/--hostfile, which this machine is not one of; taken on trust (every '
        'worker checks it before its first step): 8 GPUs per node (--gpus-per-node); NVIDIA\'s fused batchnorm '
        'kernels in their MXNet; DALI 1.24 or newer with automatic augmentation (--auto-augment)')
    # a node among the hosts: its own DALI and MXNet count, as every worker's do
    code, _, err = dry_run(monkeypatch, capsys, ['-n', '2', '-H', 'localhost:1,node2:1', '--gpus-per-node', '1',
                                                 '--data-backend', 'dali-gpu', '--auto-augment', 'ta_wide'], gpus=0)
    assert code == 2 and err.startswith('error: --auto-augment needs DALI 1.24') and '1.18.0' in err


@pytest.mark.integration   # reads the trained run's state (trained_digits trains it: 40 s the unit tier spares)
def test_val_and_pred_of_the_float16_network_take_the_4_channel_input_at_the_runs_size(monkeypatch, capsys, digits,
                                                                                        trained_digits, tmp_path):
    """The original's runner gave val and pred the 4-channel input of float16 training; this one gave it to
    training alone, so val, pred and benchmark.py --mode val ran a 3-channel NHWC stem on GPUs. The size is the
    trained run's (24x24 here), known once the flags are resolved. The mxnet backend keeps 3, as in training."""
    common = ['--workspace', str(trained_digits), '--data-root', str(digits / 'rec')]
    for mode, extra in (('val', []), ('pred', ['--data-pred', str(digits / 'images' / 'val' / 'digit_3')])):
        code, flags, err = dry_run(monkeypatch, capsys, ['--mode', mode, *common, '--data-backend', 'dali-gpu', *extra])
        assert code == 0 and flags['--image-shape'] == '4,24,24' and flags['--dtype'] == 'float16', err
    code, flags, err = dry_run(monkeypatch, capsys, ['--mode', 'val', *common])   # the run's backend: mxnet
    assert code == 0 and '--image-shape' not in flags, err
    code, flags, err = dry_run(monkeypatch, capsys, ['--mode', 'val', '--no-metrics', '--data-backend', 'synthetic',
                                                     '--workspace', str(tmp_path)])   # benchmark.py --mode val's
    assert code == 0 and flags['--image-shape'] == '4,224,224', err
    code, flags, err = dry_run(monkeypatch, capsys, ['--mode', 'val', *common], gpus=0)   # float32: 3 channels
    assert code == 0 and '--image-shape' not in flags, err


def flag_values(action):
    """Values to give `action` (a train.py flag) alone: each choice, or the candidates its type accepts."""
    if action.nargs == 0:
        return [[]]
    if action.choices:
        return [[str(choice)] for choice in action.choices]
    candidates = ['1', '16', '0', '-1', '0.5', '3,32,32', '2,4', 'x', 'model.params']
    accepted = []
    for value in candidates:
        try:
            (action.type or str)(value)
        except Exception:
            continue
        accepted.append([value])
    return accepted[:4]


@pytest.mark.unit
def test_every_train_flag_alone_plans_a_launch_or_is_one_error_line(digits, monkeypatch, tmp_path):
    """Every train.py flag given alone through the runner (everything else at its default; the digits as data,
    a new workspace) plans a launch or prints one `error:` line, on a CPU machine and on a mocked GPU node:
    `--progressive-size 16` without -e ended in a TypeError (its ramp read the epochs before they were
    resolved). The runner's check writes none of the resolution's log lines, which are the workers' (here with
    logging set up as an earlier run in this process, a worker, sets it up: they came out before each error)."""
    import logging
    import train
    from rn50.reports import logs
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    monkeypatch.setattr(root, 'handlers', list(root.handlers))
    monkeypatch.setattr(root, 'level', root.level)
    logs.setup_logging()
    outcomes, failures = {}, []
    for gpus in (0, 8):
        report_gpus(monkeypatch, gpus)
        for action in train.build_parser()._actions:
            if not action.option_strings or action.dest in ('help', 'workspace', 'data_train', 'data_val'):
                continue
            for value in flag_values(action):
                argv = ['-n', '1', '-b', '8', '--data-root', str(digits / 'rec'), '--workspace', str(tmp_path),
                        action.option_strings[-1], *value, '--dry-run']
                result = runner_main(*argv)
                errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
                ok = result.returncode == 0 and not errors or result.returncode == 2 and \
                    result.stderr.strip().splitlines() == errors and len(errors) == 1
                outcomes[result.returncode] = outcomes.get(result.returncode, 0) + 1
                if not ok:
                    failures.append((gpus, action.option_strings[-1], value, result.returncode,
                                     result.stderr[-600:]))
    assert not failures, failures[:5]
    assert outcomes[0] > 300 and outcomes[2] > 50, outcomes    # both kinds of outcome were reached


@pytest.mark.unit
def test_gpu_runs_get_the_engine_variables_of_the_original_runner(monkeypatch, capsys):
    for name in ('MXNET_ASYNC_GPU_ENGINE', 'MXNET_EXEC_ENABLE_ADDTO', 'MXNET_HOROVOD_NUM_GROUPS',
                 'HOROVOD_GROUPED_ALLREDUCES'):
        monkeypatch.delenv(name, raising=False)
    report_gpus(monkeypatch, 8)
    assert runner.main(['-n', '8', '-b', '192', '--dry-run']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {'MXNET_ASYNC_GPU_ENGINE=1', 'MXNET_EXEC_ENABLE_ADDTO=1', 'HOROVOD_ENABLE_ASYNC_COMPLETION=1',
            'MXNET_HOROVOD_NUM_GROUPS=16', 'HOROVOD_GROUPED_ALLREDUCES=1'} <= set(lines)   # the original's grouping
    monkeypatch.setenv('MXNET_EXEC_ENABLE_ADDTO', '0')   # the user's own value wins
    assert runner.main(['-n', '8', '--dry-run']) == 0
    assert not any(line.startswith('MXNET_EXEC_ENABLE_ADDTO') for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize('argv,env,message', [
    (['-n', '16', '-H', 'a:16'], {}, 'asks for 16 workers on one node but this machine has 8 GPUs'),
    (['-n', '16', '-H', 'a:8'], {}, '-n 16 but -H a:8 has 8 slots'),
    (['-n', '16', '-H', 'a,b'], {}, 'expected host:slots'),
    (['-n', '16', '--hostfile', '/nonexistent/hosts'], {}, '--hostfile /nonexistent/hosts'),
    (['-n', '32', '--launcher', 'slurm'], {'SLURM_TASKS_PER_NODE': '16(x2)'}, 'SLURM runs 16 tasks on this node'),
    (['-n', '9'], {}, '-n 9 but this machine has 8 GPUs')])
@pytest.mark.unit
def test_node_requests_beyond_the_gpus_are_refused(monkeypatch, capsys, argv, env, message):
    for name in ('SLURM_NTASKS_PER_NODE', 'SLURM_TASKS_PER_NODE', 'SLURM_LOCALID'):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = dry_run(monkeypatch, capsys, argv)
    assert code == 2 and err.count('error:') == 1 and message in err, err


SLURM_PLAN = ('SLURM_NTASKS', 'SLURM_STEP_NUM_TASKS', 'SLURM_NTASKS_PER_NODE', 'SLURM_TASKS_PER_NODE',
              'SLURM_LOCALID', 'SLURM_GPUS_PER_TASK', 'SLURM_GPU_BIND', 'CUDA_VISIBLE_DEVICES')


@pytest.mark.unit
def test_slurm_task_count_other_than_n_is_refused(monkeypatch, capsys):
    for name in SLURM_PLAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('SLURM_NTASKS', '8')
    monkeypatch.setenv('SLURM_NTASKS_PER_NODE', '8')
    code, _, err = dry_run(monkeypatch, capsys, ['-n', '16', '--launcher', 'slurm'])
    assert code == 2 and err.count('error:') == 1
    assert 'error: -n 16 but srun runs 8 tasks (SLURM_NTASKS): with --launcher slurm -n is the number of tasks' in err
    code, flags, _ = dry_run(monkeypatch, capsys, ['-n', '8', '--launcher', 'slurm'])
    assert code == 0 and flags['--batch-size'] == str(8 * 192)


@pytest.mark.parametrize('binding', [{'SLURM_GPUS_PER_TASK': '1'}, {'SLURM_GPU_BIND': 'single:1'}])
@pytest.mark.unit
def test_slurm_per_task_gpu_binding_gives_every_task_device_0(monkeypatch, capsys, binding):
    """srun --gpus-per-task 1 (or --gpu-bind): each of a node's 8 tasks sees only its own GPU, as device 0.
    Tasks that see the same one (a job-wide --gres=gpu:1) are refused by the workers, which compare their
    GPUs (tests/test_world.py); a task seeing 2 GPUs of 8 tasks is refused here."""
    for name in SLURM_PLAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('SLURM_NTASKS', '16')
    monkeypatch.setenv('SLURM_NTASKS_PER_NODE', '8')
    code, _, err = dry_run(monkeypatch, capsys, ['-n', '16', '--launcher', 'slurm'], gpus=2)
    assert code == 2 and 'SLURM runs 8 tasks on this node but each sees 2 GPUs' in err
    for name, value in binding.items():
        monkeypatch.setenv(name, value)
    code, flags, err = dry_run(monkeypatch, capsys, ['-n', '16', '--launcher', 'slurm'], gpus=1)
    assert code == 0, err
    assert flags['--gpus'] == '0' and flags['--batch-size'] == str(16 * 192) and flags['--dtype'] == 'float16'
    out = runner.main(['-n', '16', '--launcher', 'slurm', '--dry-run'])
    assert out == 0 and 'RN50_WORKERS=16' in capsys.readouterr().out


def run_runner(argv, timeout=120):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'runner')] + argv, capture_output=True, text=True,
                          env=RUN_ENV, timeout=timeout)


@pytest.mark.unit
def test_user_errors_before_launch_come_out_once(digits):
    rec = str(digits / 'rec')
    for argv, message in [(['--data-root', '/nonexistent'], "training data '/nonexistent/train.rec' not found"),
                          (['--data-root', rec, '--no-such-flag'], 'unrecognized arguments: --no-such-flag'),
                          (['--data-root', rec, '--num-layers', 'x'], "argument --num-layers"),
                          (['--data-root', rec, '--mode', 'val', '--data-val', '/nonexistent/v.rec'],
                           "validation data '/nonexistent/v.rec' not found")]:
        result = runner_main('-n', '2', '-b', '16', '--image-shape', '3,32,32', '--data-val-resize', '32', *argv)
        output = result.stdout + result.stderr
        assert result.returncode == 2 and output.count('error:') == 1 and message in result.stderr, output
        assert 'Traceback' not in output and 'horovodrun' not in output   # nothing was launched
    result = runner_main('-n', '2', '--data-root', '/nonexistent', '--dry-run')   # a dry run reads no files
    assert result.returncode == 0 and result.stdout.splitlines()[-1].startswith('horovodrun')


def demo_argv(digits, workspace, examples=256, extra=()):
    return ['-n', '2', '-b', '16', '-e', '1', '--data-root', str(digits / 'rec'), '--data-backend', 'dali-cpu',
            '--image-shape', '3,32,32', '--num-classes', '10', '--data-val-resize', '32', '--num-layers', '10',
            '--num-examples', str(examples), '--workspace', str(workspace), '--dali-threads', '1',
            '--dali-validation-threads', '1'] + list(extra)


@pytest.mark.unit
def test_a_cpu_build_of_mxnet_on_a_machine_with_gpus_is_refused(monkeypatch, capsys):
    """The runner counts GPUs with the CUDA driver, not MXNet: where the driver shows GPUs that the installed
    MXNet (a CPU build) cannot use, the plan for them is refused in one line, before any worker would refuse its
    --gpus."""
    import mxnet as mx
    report_gpus(monkeypatch, 8)
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: 0)
    assert runner.main(['-n', '1', '--dry-run']) == 2
    assert capsys.readouterr().err.startswith('error: this machine has 8 GPUs but the installed MXNet is a CPU build')
    assert runner.main(['-n', '1', '--dry-run', '--gpus-per-node', '0']) == 0   # a CPU plan, said so


@pytest.mark.integration
def test_one_worker_runs_in_the_runners_process_and_loads_mxnet_once(tmp_path):
    """-n 1: the runner runs train.py's main in its own process, MXNet loaded once (it loaded a second time in
    the train.py it exec'd, 3 s of every launch), after the worker's environment was set: OpenMP's threads as
    cpu.prepare_process gives them, in the worker's log. Without scikit-learn or SciPy's statistics and sparse
    matrices (cpu.load_mxnet)."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, 'runner'), '-n', '1', '-b', '4', '-e', '1',
                             '--data-backend', 'synthetic', '--num-layers', '10', '--image-shape', '3,32,32',
                             '--num-classes', '10', '--benchmark-iters', '2', '--mode', 'train', '--no-review',
                             '--workspace', str(tmp_path)], capture_output=True, text=True, timeout=300,
                            env=dict(RUN_ENV, PYTHONPROFILEIMPORTTIME='1', OMP_NUM_THREADS=''))
    assert result.returncode == 0, result.stderr[-3000:]
    loads = [line for line in result.stderr.splitlines() if re.fullmatch(r'import time:.*\|\s+mxnet\s*', line)]
    assert len(loads) == 1, loads
    assert not deferred_by_mxnet(modules_imported(result.stderr))
    threads = os.cpu_count() if not hasattr(os, 'sched_getaffinity') else len(os.sched_getaffinity(0))
    assert f'OMP_NUM_THREADS={threads}' in (tmp_path / 'log.log').read_text()


@HOROVOD
@pytest.mark.multiworker
def test_a_worker_user_error_after_launch_comes_out_once(digits, tmp_path):
    result = run_runner(demo_argv(digits, tmp_path, extra=['--optimizer', 'nosuch']))
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert output.count('error:') == 1 and 'error: --optimizer nosuch: no such optimizer' in result.stderr
    assert 'Traceback' not in output and 'RuntimeError' not in output


def interrupted_run(argv, signum, timeout=90):
    """Start the runner, send `signum` after the first iteration's log line; returns (exit status, output,
    seconds from the signal to the exit, the runner's descendants and its train.py workers seen just before
    the signal)."""
    import psutil
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, 'runner')] + argv, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=RUN_ENV, start_new_session=True)
    watchdog = threading.Timer(timeout, lambda: os.killpg(process.pid, signal.SIGKILL))
    watchdog.start()
    lines, descendants, workers, sent = [], [], [], None
    try:
        for line in process.stdout:
            lines.append(line)
            if sent is None and 'Iteration:' in line:
                descendants = psutil.Process(process.pid).children(recursive=True)
                workers = [p for p in descendants if p.cmdline()[1:2] == [os.path.join(ROOT, 'train.py')]]
                sent = time.time()
                process.send_signal(signum)
        code = process.wait()
    finally:
        watchdog.cancel()
    return code, ''.join(lines), time.time() - (sent or time.time()), descendants, workers


@HOROVOD
@pytest.mark.parametrize('signum', [signal.SIGTERM])   # SIGUSR1 and SIGINT take the same handler (supervisor.py)
@pytest.mark.multiworker
def test_signal_to_the_runner_stops_every_worker_with_the_state_written(digits, tmp_path, signum):
    import psutil
    from rn50.checkpoints import checkpoint
    argv = demo_argv(digits, tmp_path, examples=1024, extra=['--disp-batches', '1'])
    code, output, seconds, descendants, workers = interrupted_run(argv, signum)
    # Stopped within epoch 0 (at a --disp-batches boundary), not by horovodrun's kill or the stop timeout; the
    # seconds it took are printed, not asserted (a loaded machine stretches them).
    assert code == 0, output[-3000:]
    assert 'Traceback' not in output and 'Stopped at epoch 0' in output and len(workers) == 2
    print(f'signal {signum}: exit {seconds:.1f} s after it')
    left = [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
    meta = checkpoint.read_state(str(tmp_path / 'model_last.state')).meta
    assert meta['epoch'] == 0 and meta['iteration'] > 0
    code, output, _, descendants, _ = interrupted_run(argv, signal.SIGTERM)   # the next run resumes
    assert code == 0 and 'Resuming from' in output, output[-3000:]
    assert checkpoint.read_state(str(tmp_path / 'model_last.state')).meta['iteration'] > meta['iteration']
    assert not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


HOROVODRUN_AFTER_A_CRASH = r'''
import sys
print('[0]<stderr>:Fatal Python error: Segmentation fault', file=sys.stderr, flush=True)
print('Process 0 exit with status code 139.', file=sys.stderr, flush=True)
print('Terminating remaining workers after failure of Process 0.', file=sys.stderr, flush=True)
print('[1]<stderr>:mxnet.base.MXNetError: Horovod has been shut down.', file=sys.stderr, flush=True)
print("""Traceback (most recent call last):
  File "horovod/runner/gloo_run.py", line 284, in launch_gloo
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job
to be terminated. The first process to do so was:
Process name: 0
Exit code: 139
""", file=sys.stderr, flush=True)
sys.exit(1)
'''


@pytest.mark.unit
def test_a_crashed_worker_is_one_error_line_instead_of_horovodruns_traceback():
    """What horovodrun prints when a worker dies of SIGSEGV (as Horovod 0.28.1's broadcast did, about one
    start in 25): the workers' lines pass, horovodrun's traceback becomes one line naming the worker."""
    import io
    out, err = io.StringIO(), io.StringIO()
    supervisor = runner.Supervisor([sys.executable, '-c', HOROVODRUN_AFTER_A_CRASH], dict(os.environ), 30,
                                   runner.TRAIN_PY, out=out, err=err)
    assert supervisor.report(supervisor.run()) == 1
    lines = err.getvalue().splitlines()
    assert lines[0] == '[0]<stderr>:Fatal Python error: Segmentation fault'
    assert 'Traceback' not in err.getvalue() and 'RuntimeError' not in err.getvalue()
    assert lines[-1].startswith('error: worker 0 ended with signal SIGSEGV (exit status 139)')
    assert sum(line.startswith('error:') for line in lines) == 1


@HOROVOD
@pytest.mark.integration
def test_the_runners_horovodrun_starts_the_workers_without_loading_mxnet(tmp_path):
    """horovodrun checks Horovod's build by importing horovod.mxnet, MXNet with it, before any worker starts
    (2.5 s of a core each launch); the runner's (rn50/launch/horovodrun.py) reads the same answers from the
    extension's library. With an MXNet that cannot load, horovodrun itself stops; the runner's starts the
    workers, and its answers are Horovod's own."""
    from rn50.launch import horovodrun, supervisor
    assert horovodrun.build_answers() == horovod_says("{'gloo_built': hvd.gloo_built(), 'mpi_built': hvd.mpi_built()}")
    (tmp_path / 'mxnet').mkdir()
    (tmp_path / 'mxnet' / '__init__.py').write_text('raise ImportError("MXNet was loaded")\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    command = ['horovodrun', '-np', '2', '--gloo', sys.executable, '-c', 'print("a worker")']
    launched = subprocess.run(supervisor.started(command), capture_output=True, text=True, env=env,
                              timeout=120)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert launched.stdout.count('a worker') == 2
    plain = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode != 0 and 'Gloo support has not been built' in plain.stderr
    # A GPU launch's command (no --gloo): horovodrun asks for MPI, then Gloo; here, without MPI, Gloo starts them
    gpu_command = [part for part in command if part != '--gloo']
    launched = subprocess.run(supervisor.started(gpu_command), capture_output=True, text=True, env=env, timeout=120)
    assert launched.returncode == 0 and launched.stdout.count('a worker') == 2, launched.stderr[-2000:]
    plain = subprocess.run(gpu_command, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode != 0 and 'Neither MPI nor Gloo support has been built' in plain.stderr
    (tmp_path / 'bare' / 'horovod').mkdir(parents=True)       # a Horovod without its launcher: one error line
    (tmp_path / 'bare' / 'horovod' / '__init__.py').write_text('')
    missing = subprocess.run(supervisor.started(command), capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=str(tmp_path / 'bare')))
    assert missing.returncode == 2 and missing.stderr.startswith('error: Horovod is not installed for ')
    assert missing.stderr.count('\n') == 1 and 'make setup' in missing.stderr


@pytest.mark.unit
def test_missing_validation_data_points_to_mode_train(monkeypatch, capsys, tmp_path):
    (tmp_path / 'train.rec').write_bytes(b'')
    (tmp_path / 'train.idx').write_text('')
    report_gpus(monkeypatch, 0)
    assert runner.main(['--data-root', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'val.rec\' not found' in err and 'train with --mode train (prepare_dataset.py --splits train' in err


@pytest.mark.unit
def test_the_mlperf_recipe_sets_its_values_for_the_global_batch_and_flags_win(monkeypatch, capsys):
    """MLPerf's 8-GPU configuration: 400 images per GPU, 11.0 at 3,200 images, LARS, poly decay over 37 epochs,
    evaluation every 4 epochs from epoch 2; a flag given on the command line wins."""
    import train
    _, flags, raw = command(['-n', '8', '--recipe', 'mlperf'], gpus=8)
    assert flags['--batch-size'] == '3200' and float(flags['--lr']) == pytest.approx(11.0)
    args = train.parse_flags(raw)[0]
    assert (args.optimizer, args.lr_schedule, args.num_epochs, args.warmup_epochs, args.wd, args.mom) == \
        ('lars', 'poly', 37, 2.0, 5e-5, 0.9)
    assert (args.eval_period, args.eval_offset, args.label_smoothing, args.end_lr) == (4, 2, 0.1, 0.0001)
    _, flags, raw = command(['-n', '8', '-b', '256', '-e', '40', '--recipe', 'mlperf', '--wd', '1e-4'], gpus=8)
    args = train.parse_flags(raw)[0]
    assert flags['--batch-size'] == '2048' and float(flags['--lr']) == pytest.approx(0.88 * 2048 / 256)
    assert (args.num_epochs, args.wd, args.optimizer) == (40, 1e-4, 'lars')
    direct, origin = train.parse_flags(['--recipe', 'mlperf', '--batch-size', '512'])
    assert direct.lr == pytest.approx(0.88 * 2) and origin.from_recipe[0] == 'optimizer'
    nvidia = train.parse_flags(['--recipe', 'nvidia'])[0]
    default = train.parse_flags([])[0]
    assert {k: v for k, v in vars(nvidia).items() if k not in ('recipe', 'lr')} == \
        {k: v for k, v in vars(default).items() if k not in ('recipe', 'lr')}


@pytest.mark.parametrize('gpus', [8, 0])
@pytest.mark.unit
def test_the_torchvision_and_timm_recipes_set_their_published_values(gpus):
    """torchvision-v2: 0.5 at 1,024 images, 600 epochs, TrivialAugment, random erasing, mixup/CutMix, 4 repeats,
    the weight average every 32 steps, trained at 176 (the runner's --image-shape follows the recipe, with 4
    channels for float16 on GPUs) and tested at 224 after 232; rsb-a3: LAMB 8e-3 at 2,048, BCE, RandAugment m6,
    160/224 after 236 (at 192: 269 after 283). A flag on the command line wins."""
    import train
    channels = 4 if gpus else 3
    _, flags, raw = command(['-n', '8', '--recipe', 'torchvision-v2'], gpus=gpus)
    args = train.parse_flags(raw)[0]
    assert flags['--batch-size'] == '1024' and float(flags['--lr']) == pytest.approx(0.5)
    assert (args.num_epochs, args.warmup_epochs, args.wd, args.label_smoothing, args.mixup, args.cutmix) == \
        (600, 5.0, 2e-5, 0.1, 0.2, 1.0)
    assert (args.auto_augment, args.random_erase, args.aug_repeats) == ('ta_wide', 0.1, 4)
    assert (args.model_ema, args.model_ema_steps, args.model_ema_decay, args.model_ema_adjust) == \
        (True, 32, 0.99998, True)
    assert (args.image_shape, args.val_image_shape[1:], args.data_val_resize) == ((channels, 176, 176), (224, 224), 232)
    _, flags, raw = command(['-n', '8', '--recipe', 'rsb-a3', '--image-shape', f'{channels},192,192'], gpus=gpus)
    args = train.parse_flags(raw)[0]
    assert flags['--batch-size'] == '2048' and float(flags['--lr']) == pytest.approx(0.008)
    assert (args.optimizer, args.wd, args.num_epochs, args.bce_loss, args.bce_target_thresh, args.label_smoothing) == \
        ('lamb', 0.02, 100, True, 0.2, 0.0)
    assert (args.auto_augment, args.ra_magnitude, args.mixup, args.cutmix) == ('ra', 6, 0.1, 1.0)
    # a training size the command gives tests at the recipe's ratios (tests/test_recipe_sizes.py)
    assert (args.image_shape, args.val_image_shape[1:], args.data_val_resize) == ((channels, 192, 192), (269, 269), 283)


@HOROVOD
@pytest.mark.parametrize('recipe', ['torchvision-v2', 'rsb-a3'])
@pytest.mark.multiworker
def test_the_torchvision_and_timm_recipes_train_on_two_cpu_workers(digits, tmp_path, recipe):
    """Each recipe, at the digits' sizes, for one epoch on 2 workers: every piece it sets runs (automatic
    augmentation, erasing, repeats, the weight average, BCE, LAMB) and validation tests at its own size."""
    result = run_runner(demo_argv(digits, tmp_path, examples=64, extra=[
        '--recipe', recipe, '-b', '8', '-e', '1', '--warmup-epochs', '0', '--image-shape', '3,32,32',
        '--val-image-shape', '3,40,40', '--data-val-resize', '46']))
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / 'log.log').read_text()
    assert f'Recipe {recipe}: ' in log and 'Validation' in log
    config = json.loads((tmp_path / 'report.json').read_text())['config']
    expected = {'torchvision-v2': {'auto_augment': 'ta_wide', 'aug_repeats': 4, 'model_ema': True},
                'rsb-a3': {'auto_augment': 'ra', 'optimizer': 'lamb', 'bce_loss': True}}[recipe]
    assert {key: config[key] for key in expected} == expected
    assert config['val_image_shape'] == [3, 40, 40]
