"""The world a run trains in is the world it asked for: each worker checks what Horovod formed against what
its launchers announced (the runner, srun, horovodrun, mpirun) before it writes anything; a Horovod worker
takes the GPU of its local rank, or its one bound GPU; every worker starts from rank 0's state or all stop;
a damaged last state is set aside once however many workers find it."""
import argparse
import os
import shutil
import subprocess
import sys

import mxnet as mx
import pytest

import checkpoint
import workers
from conftest import ROOT, digits_flags, train_args
from errors import RecipeError
from test_workers import TwoWorkerHorovod

HOROVOD = pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')


def world(rank=0, size=1, local_rank=0, local_size=1, horovod=True):
    """A World as Horovod would have formed it (no Horovod started)."""
    formed = object.__new__(workers.World)
    formed.rank, formed.size, formed.local_rank, formed.local_size = rank, size, local_rank, local_size
    formed.horovod = object() if horovod else None
    return formed


SRUN_TASK_1_OF_2 = {'SLURM_JOB_ID': '77', 'SLURM_STEP_ID': '0', 'SLURM_NTASKS': '2', 'SLURM_PROCID': '1',
                    'SLURM_LOCALID': '1', 'SLURM_NODEID': '0', 'SLURM_NTASKS_PER_NODE': '2'}


@pytest.mark.parametrize('formed,environ,message', [
    # srun's task 1 of 2, where a Horovod without MPI (or without PMI) forms a world of one
    (world(), SRUN_TASK_1_OF_2, 'srun (SLURM_NTASKS) says 2 workers, rank 1, local rank 1, workers on this node 2'),
    # the runner's -n 16 under srun's 8 tasks that did form a world of 8
    (world(3, 8, 3, 8), dict(SRUN_TASK_1_OF_2, SLURM_NTASKS='8', SLURM_PROCID='3', SLURM_LOCALID='3',
                             SLURM_NTASKS_PER_NODE='8', RN50_WORKERS='16'), 'the runner (-n) says 16 workers'),
    # python train.py --kv-store horovod by hand under horovodrun and mpirun
    (world(), {'HOROVOD_SIZE': '4', 'HOROVOD_RANK': '2', 'HOROVOD_LOCAL_RANK': '0', 'HOROVOD_LOCAL_SIZE': '2'},
     'horovodrun (HOROVOD_SIZE) says 4 workers, rank 2'),
    (world(), {'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '1'}, 'mpirun (OMPI_COMM_WORLD_SIZE) says 2'),
    (world(), {'PMI_SIZE': '2', 'PMI_RANK': '1'}, 'PMI (PMI_SIZE) says 2 workers, rank 1'),
    # the world's size is right but the node holds more workers than srun put there
    (world(1, 2, 1, 2), dict(SRUN_TASK_1_OF_2, SLURM_NTASKS_PER_NODE='1', SLURM_LOCALID='0'),
     'local rank 0, workers on this node 1'),
    # --kv-store device is one process, but srun started two
    (world(horovod=False), dict(SRUN_TASK_1_OF_2, RN50_WORKERS='1'), '--kv-store device (one process) formed'),
])
def test_a_world_other_than_the_announced_one_is_refused(formed, environ, message):
    with pytest.raises(RecipeError) as error:
        workers.check_world(formed, environ)
    assert message in str(error.value) and 'srun --mpi=pmix' in str(error.value) and '-H host1:8' in str(error.value)


@pytest.mark.parametrize('formed,environ', [
    (world(1, 2, 1, 2), SRUN_TASK_1_OF_2),
    (world(1, 2, 1, 2), dict(SRUN_TASK_1_OF_2, RN50_WORKERS='2', SLURM_TASKS_PER_NODE='2(x1)')),
    # a batch script (no step) in an allocation of 8 tasks: SLURM_NTASKS describes the allocation
    (world(), {'SLURM_JOB_ID': '77', 'SLURM_NTASKS': '8', 'SLURM_PROCID': '0', 'RN50_WORKERS': '1'}),
    # horovodrun inside an srun step: horovodrun's variables count, the step's do not
    (world(1, 2, 1, 2), dict(SRUN_TASK_1_OF_2, SLURM_NTASKS='1', SLURM_PROCID='0', HOROVOD_SIZE='2',
                             HOROVOD_RANK='1', HOROVOD_LOCAL_RANK='1', HOROVOD_LOCAL_SIZE='2')),
    # nodes with different task counts: the node's own count is not known, the rest is checked
    (world(5, 6, 1, 2), {'SLURM_STEP_ID': '0', 'SLURM_NTASKS': '6', 'SLURM_PROCID': '5', 'SLURM_LOCALID': '1',
                         'SLURM_TASKS_PER_NODE': '4,2'}),
    (world(horovod=False), {'RN50_WORKERS': '1'}),
])
def test_the_announced_world_is_accepted(formed, environ):
    workers.check_world(formed, environ)


# --------------------------------------------------------------------------------------------------------
# Devices


def gpu_choice(monkeypatch, gpus_on_node, local_rank, local_size, environ=None, flags=()):
    """The device ids resolve_hardware gives a Horovod worker of a node with `gpus_on_node` visible GPUs."""
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: gpus_on_node)
    for name in ('CUDA_VISIBLE_DEVICES', 'SLURM_GPUS_PER_TASK', 'SLURM_GPU_BIND'):
        monkeypatch.delenv(name, raising=False)
    for name, value in (environ or {}).items():
        monkeypatch.setenv(name, value)
    args = train_args(['--kv-store', 'horovod', '--batch-size', '64'] + list(flags))
    workers.resolve_hardware(args, world(local_rank, local_size, local_rank, local_size))
    return [(ctx.device_type, ctx.device_id) for ctx in args.contexts]


def test_a_horovod_worker_without_gpus_flag_takes_the_gpu_of_its_local_rank(monkeypatch):
    assert gpu_choice(monkeypatch, 8, 5, 8) == [('gpu', 5)]
    assert gpu_choice(monkeypatch, 8, 0, 1) == [('gpu', 0)]
    assert gpu_choice(monkeypatch, 8, 2, 4, flags=['--gpus', '4,5,6,7']) == [('gpu', 6)]
    with pytest.raises(RecipeError, match='local rank 3 has no GPU in --gpus 0,1,2 .3 GPUs on this node, 4'):
        gpu_choice(monkeypatch, 3, 3, 4)


@pytest.mark.parametrize('binding', [{'SLURM_GPUS_PER_TASK': '1'}, {'SLURM_GPU_BIND': 'single:1'},
                                     {'CUDA_VISIBLE_DEVICES': '5'}])
def test_a_worker_bound_to_one_gpu_takes_device_0(monkeypatch, binding):
    assert gpu_choice(monkeypatch, 1, 7, 8, binding) == [('gpu', 0)]
    assert gpu_choice(monkeypatch, 1, 7, 8, binding, flags=['--gpus', '0']) == [('gpu', 0)]


def test_workers_sharing_one_unbound_gpu_are_refused(monkeypatch):
    with pytest.raises(RecipeError, match='2 workers run on this node and each sees the same single GPU'):
        gpu_choice(monkeypatch, 1, 1, 2)


# --------------------------------------------------------------------------------------------------------
# Every worker starts from rank 0's state


def rank1_of_2(rank0_contributions):
    """Rank 1 of a two-worker World whose all-reduces add rank 0's `rank0_contributions` (in call order)."""
    formed = world(1, 2, 1, 2)
    formed.horovod = TwoWorkerHorovod(rank0_contributions)
    return formed


def fresh_args(workspace):
    return train_args(['--workspace', str(workspace)])


def test_a_worker_that_sees_no_state_while_rank_0_resumes_stops_every_worker(tmp_path):
    rank0_resumes = [[0, 1, 3, 0, 8, 12345], [0]]     # no failure; resumes at epoch 3 iteration 0; agrees
    with pytest.raises(RecipeError, match='worker 0 resumes from its model_last.state or --load state at epoch 3, '
                                          'iteration 0, and 1 of the 2 workers see another state or none. every '
                                          'worker reads .*filesystem they share'):
        checkpoint.agreed_training_start(fresh_args(tmp_path), None, rank1_of_2(rank0_resumes))


def test_a_worker_that_fails_alone_stops_every_worker(tmp_path):
    rank0_failed = [[1, 0, 0, 0, 0, 0]]
    with pytest.raises(RecipeError, match='1 of 2 workers could not open the checkpoint this run starts from'):
        checkpoint.agreed_training_start(fresh_args(tmp_path), None, rank1_of_2(rank0_failed))


def test_workers_that_agree_start(tmp_path):
    assert checkpoint.agreed_training_start(fresh_args(tmp_path), None, rank1_of_2([[0] * 6, [0]])) is None


def test_a_damaged_state_set_aside_by_another_worker_meanwhile_is_no_failure(tmp_path, monkeypatch):
    """Two workers find the same damaged file: the other one moves it between this one's read and rename."""
    path = tmp_path / 'model_last.state'
    path.write_bytes(b'damaged')
    read_state = checkpoint.read_state

    def read_while_the_other_worker_moves_it(name, fallback=None):
        try:
            return read_state(name, fallback)
        finally:
            os.replace(name, f'{name}.damaged')
    monkeypatch.setattr(checkpoint, 'read_state', read_while_the_other_worker_moves_it)
    checkpoint.set_aside_if_damaged(str(path))
    assert not path.exists() and (tmp_path / 'model_last.state.damaged').read_bytes() == b'damaged'


# --------------------------------------------------------------------------------------------------------
# CPU twins: real workers


RUN_ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' + os.environ['PATH'], OMP_NUM_THREADS='1')


def test_srun_tasks_whose_world_does_not_form_stop_at_once_writing_nothing(tmp_path):
    """Two tasks started as srun starts them (each its SLURM_* variables), with this Horovod, which has no
    MPI and so cannot join them: each finds a world of one and stops with the error, exit status 2."""
    workspace = tmp_path / 'ws'
    tasks = []
    for rank in range(2):
        environ = dict(RUN_ENV, SLURM_JOB_ID='77', SLURM_STEP_ID='0', SLURM_NTASKS='2', SLURM_PROCID=str(rank),
                       SLURM_LOCALID=str(rank), SLURM_NODEID='0', SLURM_NTASKS_PER_NODE='2')
        tasks.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, 'runner'), '-n', '2', '-b', '8', '-e', '1', '--launcher', 'slurm',
             '--mode', 'train', '--data-backend', 'synthetic', '--num-layers', '18', '--image-shape', '3,32,32',
             '--num-classes', '10', '--num-examples', '64', '--workspace', str(workspace)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ))
    for rank, task in enumerate(tasks):
        out, err = task.communicate(timeout=120)
        errors = [line for line in (out + err).splitlines() if line.startswith('error:')]
        assert task.returncode == 2 and len(errors) == 1, out + err
        assert (f'Horovod formed a world of 1 worker (this one: rank 0, local rank 0, 1 on its node) but the runner '
                f'(-n) says 2 workers; srun (SLURM_NTASKS) says 2 workers, rank {rank}, local rank {rank}') in errors[0]
        assert 'srun --mpi=pmix' in errors[0] and 'Traceback' not in err
    assert not workspace.exists()


@HOROVOD
def test_node_local_workspaces_stop_a_resume_instead_of_training_on(digits, tmp_path):
    """Two workers whose --workspace differs by rank, as node-local ones do: the first run trains (rank 0
    writes the state in its own), the second must not train rank 0 from epoch 1 and rank 1 from scratch."""
    command = ['horovodrun', '-np', '2', '--gloo', 'sh', '-c',
               'exec "$@" --workspace "$WORKSPACES/ws$HOROVOD_RANK"', 'sh',
               sys.executable, os.path.join(ROOT, 'train.py'), *digits_flags(digits, 32), '--kv-store', 'horovod',
               '--data-backend', 'synthetic', '--num-layers', '18', '--num-examples', '64', '--seed', '3',
               '--mode', 'train']
    environ = dict(RUN_ENV, WORKSPACES=str(tmp_path))
    first = subprocess.run(command + ['--num-epochs', '1'], capture_output=True, text=True, env=environ)
    assert first.returncode == 0, first.stderr[-3000:]
    state = (tmp_path / 'ws0' / 'model_last.state').read_bytes()
    assert not (tmp_path / 'ws1' / 'model_last.state').exists()
    second = subprocess.run(command + ['--num-epochs', '2'], capture_output=True, text=True, env=environ)
    output = second.stdout + second.stderr
    assert second.returncode != 0, output[-3000:]
    assert ('error: the workers would not start from the same state: worker 0 resumes from its model_last.state or '
            '--load state at epoch 1, iteration 0, and 1 of the 2 workers see another state or none') in output
    assert 'filesystem they share' in output and 'Starting epoch 1' not in output
    assert (tmp_path / 'ws0' / 'model_last.state').read_bytes() == state
    assert not (tmp_path / 'ws1' / 'model_last.state').exists()
