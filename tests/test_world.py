"""The world a run trains in is the world it asked for: each worker checks what Horovod formed against what
its launchers announced (the runner, srun, horovodrun, mpirun) before it writes anything; a Horovod worker
takes the GPU of its local rank, or its one bound GPU; every worker starts from rank 0's state or all stop;
a damaged last state is set aside once however many workers find it."""
import os
import shutil
import socket
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import fit

from rn50.checkpoints import checkpoint
from rn50.checkpoints import resume
from rn50.checkpoints.workspace import Workspace
from rn50.world import devices, rendezvous, workers
from conftest import ROOT, digits_flags, train_args, two_gloo_workers
from rn50.errors import RecipeError
from test_workers import TwoWorkerHorovod

HOROVOD = pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')


def world(rank=0, size=1, local_rank=0, local_size=1, horovod=True):
    """The Communicator of a world as Horovod would have formed it (no Horovod started)."""
    return workers.Communicator(object() if horovod else None, rank, size, local_rank, local_size)


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
@pytest.mark.unit
def test_a_world_other_than_the_announced_one_is_refused(formed, environ, message):
    with pytest.raises(RecipeError) as error:
        rendezvous.check_world(formed, environ)
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
@pytest.mark.unit
def test_the_announced_world_is_accepted(formed, environ):
    rendezvous.check_world(formed, environ)


# --------------------------------------------------------------------------------------------------------
# Devices


def gpu_choice(monkeypatch, gpus_on_node, local_rank, local_size, environ=None, flags=(), node=None):
    """The device ids resolve_devices gives a Horovod worker of a node with `gpus_on_node` visible GPUs;
    `node`: the environments of the node's other workers, whose GPUs the gather of
    check_one_worker_per_gpu returns beside this one's (default: each has a GPU of its own)."""
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: gpus_on_node)
    for name in ('CUDA_VISIBLE_DEVICES', 'SLURM_GPUS_PER_TASK', 'SLURM_GPU_BIND'):
        monkeypatch.delenv(name, raising=False)
    for name, value in (environ or {}).items():
        monkeypatch.setenv(name, value)
    args = train_args(['--kv-store', 'horovod', '--batch-size', '64'] + list(flags))
    formed = world(local_rank, local_size, local_rank, local_size)
    host = socket.gethostname()
    others = [devices.gpu_key(host, devices.physical_gpu(mx.gpu(0), other)) for other in (node or [])]
    formed.gather = lambda values: np.array([values] + others, dtype=np.float32)
    found = devices.resolve_devices(formed, devices.DeviceRequest.of(args))
    return [(ctx.device_type, ctx.device_id) for ctx in found.contexts]


@pytest.mark.unit
def test_slurms_task_lists_are_read_in_one_place():
    """SLURM's compressed task lists, as the runner plans with them and the workers check their world against
    them: one parser (launch/nodes.py) for both."""
    from rn50.launch import nodes
    from rn50.world import rendezvous
    assert nodes.slurm_task_counts('2(x3),1') == [2, 2, 2, 1] and nodes.slurm_task_counts(None) == []
    environ = {'SLURM_STEP_TASKS_PER_NODE': '4(x2),3', 'SLURM_TASKS_PER_NODE': '8'}
    assert rendezvous.tasks_per_node(environ) == [4, 4, 3] and rendezvous.uniform_tasks_per_node(environ) is None
    assert nodes.slurm_tasks_per_node({'SLURM_TASKS_PER_NODE': '4(x2),3'}) == 4
    assert rendezvous.uniform_tasks_per_node({'SLURM_TASKS_PER_NODE': '8(x2)'}) == 8


@pytest.mark.unit
def test_a_horovod_worker_without_gpus_flag_takes_the_gpu_of_its_local_rank(monkeypatch):
    assert gpu_choice(monkeypatch, 8, 5, 8) == [('gpu', 5)]
    assert gpu_choice(monkeypatch, 8, 0, 1) == [('gpu', 0)]
    assert gpu_choice(monkeypatch, 8, 2, 4, flags=['--gpus', '4,5,6,7']) == [('gpu', 6)]
    # fewer GPUs than workers: every worker stops (rank 0 too), not only those left without one
    for rank in (0, 3):
        with pytest.raises(RecipeError, match='4 workers run on this node and it has 3 GPUs for them'):
            gpu_choice(monkeypatch, 3, rank, 4)


@pytest.mark.parametrize('binding', [{'SLURM_GPUS_PER_TASK': '1'}, {'SLURM_GPU_BIND': 'single:1'},
                                     {'CUDA_VISIBLE_DEVICES': '5'}])
@pytest.mark.unit
def test_a_worker_bound_to_one_gpu_takes_device_0(monkeypatch, binding):
    assert gpu_choice(monkeypatch, 1, 7, 8, binding) == [('gpu', 0)]
    assert gpu_choice(monkeypatch, 1, 7, 8, binding, flags=['--gpus', '0']) == [('gpu', 0)]


@pytest.mark.unit
def test_one_process_takes_every_gpu_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: 8)
    args = train_args(['--batch-size', '32'])
    with caplog.at_level('INFO', logger='rn50.world.devices'):
        found = devices.resolve_devices(world(horovod=False), devices.DeviceRequest.of(args))
    assert [ctx.device_id for ctx in found.contexts] == list(range(8))
    assert ('This process trains on GPUs 0,1,2,3,4,5,6,7: 4 images per GPU of the global batch 32 (batchnorm '
            'statistics over 4 images)') in caplog.messages


@pytest.mark.unit
def test_tasks_bound_to_their_own_gpus_by_cuda_visible_devices_train(monkeypatch):
    """srun --gpus-per-task 1: each task's CUDA_VISIBLE_DEVICES names another GPU."""
    assert gpu_choice(monkeypatch, 1, 1, 2, {'CUDA_VISIBLE_DEVICES': '1'},
                      node=[{'CUDA_VISIBLE_DEVICES': '0'}]) == [('gpu', 0)]


@pytest.mark.parametrize('environ', [{}, {'CUDA_VISIBLE_DEVICES': '0'}, {'CUDA_VISIBLE_DEVICES': 'GPU-8f3a'}])
@pytest.mark.unit
def test_workers_sharing_one_gpu_are_refused(monkeypatch, environ):
    """srun --ntasks-per-node 2 --gres=gpu:1 sets one CUDA_VISIBLE_DEVICES for the job: both tasks see the same
    GPU as device 0 (it used to be taken for per-task binding, and both trained on it without a word)."""
    with pytest.raises(RecipeError, match='several workers train on the same GPU'):
        gpu_choice(monkeypatch, 1, 1, 2, environ, node=[environ])


# --------------------------------------------------------------------------------------------------------
# Every worker starts from rank 0's state


def rank1_of_2(rank0_contributions):
    """Rank 1 of a two-worker World whose all-reduces add rank 0's `rank0_contributions` (in call order)."""
    return workers.World(workers.Communicator(TwoWorkerHorovod(rank0_contributions), 1, 2, 1, 2))


def fresh_start(workspace):
    """(Workspace, resume.TrainingStart) of a new run in `workspace`."""
    args = train_args(['--workspace', str(workspace)])
    return Workspace.of(args), resume.TrainingStart.of(args, fit.RESUMED_SETTINGS)


@pytest.mark.unit
def test_a_worker_that_sees_no_state_while_rank_0_resumes_stops_every_worker(tmp_path):
    rank0_resumes = [[0, 1, 3, 0, 8, 12345], [0]]     # no failure; resumes at epoch 3 iteration 0; agrees
    with pytest.raises(RecipeError, match='worker 0 resumes from its model_last.state or --load state at epoch 3, '
                                          'iteration 0, and 1 of the 2 workers see another state or none. Every '
                                          'worker reads .*filesystem they share'):
        resume.agreed_training_start(*fresh_start(tmp_path), None, rank1_of_2(rank0_resumes))


@pytest.mark.unit
def test_a_worker_that_fails_alone_stops_every_worker(tmp_path):
    rank0_failed = [[1, 0, 0, 0, 0, 0]]
    with pytest.raises(RecipeError, match='1 of 2 workers could not open the checkpoint this run starts from'):
        resume.agreed_training_start(*fresh_start(tmp_path), None, rank1_of_2(rank0_failed))


@pytest.mark.unit
def test_workers_that_agree_start(tmp_path):
    assert resume.agreed_training_start(*fresh_start(tmp_path), None, rank1_of_2([[0] * 6, [0]])) is None


@pytest.mark.unit
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
    resume.set_aside_if_damaged(str(path))
    assert not path.exists() and (tmp_path / 'model_last.state.damaged').read_bytes() == b'damaged'


# --------------------------------------------------------------------------------------------------------
# CPU twins: real workers


RUN_ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + ':' + os.environ['PATH'], OMP_NUM_THREADS='1')


def srun_tasks(argv, environ, tasks=2):
    """`./runner argv` started `tasks` times on this node as srun starts its tasks: each with its own SLURM_*
    variables (`environ` adds to or, with None values, removes from those of a real srun step)."""
    started = []
    for rank in range(tasks):
        step = {'SLURM_JOB_ID': '77', 'SLURM_STEP_ID': '0', 'SLURM_NTASKS': str(tasks), 'SLURM_STEP_NUM_TASKS':
                str(tasks), 'SLURM_PROCID': str(rank), 'SLURM_LOCALID': str(rank), 'SLURM_NODEID': '0',
                'SLURM_NTASKS_PER_NODE': str(tasks), 'SLURM_TASKS_PER_NODE': str(tasks),
                'SLURM_STEP_TASKS_PER_NODE': str(tasks), 'SLURM_STEP_NODELIST': 'localhost'}
        step.update(environ)
        task_environ = dict(RUN_ENV, **{name: value for name, value in step.items() if value is not None})
        started.append(subprocess.Popen([sys.executable, os.path.join(ROOT, 'runner')] + argv, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=task_environ))
    return [(task.returncode, out + err) for task in started for out, err in [task.communicate(timeout=600)]]


def synthetic_argv(workspace, n=2):
    return ['-n', str(n), '-b', '8', '-e', '1', '--mode', 'train', '--data-backend', 'synthetic', '--num-layers', '10',
            '--image-shape', '3,32,32', '--num-classes', '10', '--num-examples', '64', '--seed', '5',
            '--workspace', str(workspace)]


# A process that joined Horovod's world, then looks for the undecodable record among a failed batch's (dali.py,
# data.py): Pillow must still decode every good one.
FIND_UNDECODABLE = """
import sys
from rn50.data import records
from rn50.world import workers
workers.Communicator.start('horovod')
print(records.find_undecodable(records.RecordFile(sys.argv[1], sys.argv[2], 10, 'training'), range(16)))
"""


@pytest.mark.integration
def test_a_horovod_worker_still_tells_good_records_from_undecodable_ones(digits):
    """horovod.mxnet makes libmxnet's symbols global, its own libjpeg among them: a Pillow loaded after it took
    that libjpeg and failed on every JPEG ('broken data stream'), so a decoder error in a Horovod run (every
    runner run) named the first record of the batch as the undecodable one."""
    rec = digits / 'rec'
    result = subprocess.run([sys.executable, '-c', FIND_UNDECODABLE, str(rec / 'train.rec'), str(rec / 'train.idx')],
                            cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ['None']


@pytest.mark.multiworker
def test_tasks_whose_world_does_not_form_stop_at_once_writing_nothing(tmp_path):
    """The issue's reproduction: two tasks with only SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID,
    SLURM_NTASKS_PER_NODE, SLURM_NODEID and SLURM_JOB_ID (no srun step to join over Gloo): each finds a world
    of one, where each used to train alone on the whole batch; now each stops, exit status 2."""
    workspace = tmp_path / 'ws'
    not_a_step = {name: None for name in ('SLURM_STEP_ID', 'SLURM_STEP_NUM_TASKS', 'SLURM_TASKS_PER_NODE',
                                          'SLURM_STEP_TASKS_PER_NODE', 'SLURM_STEP_NODELIST')}
    for code, output in srun_tasks(synthetic_argv(workspace) + ['--launcher', 'slurm'], not_a_step):
        errors = [line for line in output.splitlines() if line.startswith('error:')]
        assert code == 2 and len(errors) == 1, output
        assert errors[0].startswith('error: Horovod formed a world of 1 worker (this one: rank 0, local rank 0, 1 on '
                                    'its node) but the runner (-n) says 2 workers: the workers did not find each other')
        assert 'srun --mpi=pmix' in errors[0] and 'Traceback' not in output
    assert not workspace.exists()


@HOROVOD
@pytest.mark.multiworker
def test_srun_tasks_form_a_gloo_world_and_train_like_horovodrun(tmp_path):
    """Two tasks of a real srun step (its SLURM_STEP_* variables) with this Horovod without MPI: task 0 serves
    the rendezvous, both join one world of 2 and train exactly as horovodrun's two workers do."""
    import socket
    with socket.socket() as probe:
        probe.bind(('', 0))
        port = str(probe.getsockname()[1])
    results = srun_tasks(synthetic_argv(tmp_path / 'srun') + ['--launcher', 'slurm'], {'RN50_RENDEZVOUS_PORT': port})
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    horovodrun = subprocess.run([sys.executable, os.path.join(ROOT, 'runner')] + synthetic_argv(tmp_path / 'hvd'),
                                capture_output=True, text=True, env=RUN_ENV)
    assert horovodrun.returncode == 0, horovodrun.stderr[-3000:]
    states = [checkpoint.read_state(str(tmp_path / name / 'model_last.state')) for name in ('srun', 'hvd')]
    assert states[0].meta['workers'] == states[1].meta['workers'] == 2
    losses = [[epoch['train.loss'] for epoch in state.meta['history']] for state in states]
    assert len(losses[0]) == 1 and losses[0] == pytest.approx(losses[1], rel=1e-6)
    for name, value in states[1].params.items():
        assert abs(states[0].params[name].asnumpy() - value.asnumpy()).max() <= 1e-5, name


@pytest.mark.unit
def test_srun_variables_become_horovods_gloo_world(monkeypatch):
    """Task 5 of 8 on the second of two nodes of 4 tasks each, as horovodrun's gloo_run would set it up."""
    served = []
    monkeypatch.setattr(os, 'environ', {})
    monkeypatch.setattr(rendezvous, 'serve_rendezvous',
                        lambda port, hosts, counts: served.append((port, hosts, counts)))
    monkeypatch.setattr(rendezvous, 'wait_for_rendezvous', lambda address, port: served.append((address, port)))
    step = {'SLURM_JOB_ID': '1000', 'SLURM_STEP_ID': '3', 'SLURM_NTASKS': '8', 'SLURM_PROCID': '5',
            'SLURM_LOCALID': '1', 'SLURM_NODEID': '1', 'SLURM_STEP_TASKS_PER_NODE': '4(x2)',
            'SLURM_STEP_NODELIST': 'gpu[07-08]'}
    assert rendezvous.srun_task_of_many(step)
    rendezvous.join_slurm_world_over_gloo(step)
    assert os.environ == {
        'HOROVOD_HOSTNAME': 'slurm-node1', 'HOROVOD_RANK': '5', 'HOROVOD_SIZE': '8', 'HOROVOD_LOCAL_RANK': '1',
        'HOROVOD_LOCAL_SIZE': '4', 'HOROVOD_CROSS_RANK': '1', 'HOROVOD_CROSS_SIZE': '2',
        'HOROVOD_GLOO_RENDEZVOUS_ADDR': 'gpu07', 'HOROVOD_GLOO_RENDEZVOUS_PORT': str(20000 + (1000 * 16 + 3) % 20000),
        'HOROVOD_CONTROLLER': 'gloo', 'HOROVOD_CPU_OPERATIONS': 'gloo'}
    assert served == [('gpu07', 36003)]
    rendezvous.join_slurm_world_over_gloo(dict(step, SLURM_PROCID='0', SLURM_LOCALID='0', SLURM_NODEID='0'))
    assert served[-1] == (36003, ['slurm-node0', 'slurm-node1'], [4, 4])
    assert not rendezvous.srun_task_of_many(dict(step, HOROVOD_SIZE='8'))      # horovodrun inside the step


@HOROVOD
@pytest.mark.multiworker
def test_node_local_workspaces_stop_a_resume_instead_of_training_on(digits, tmp_path):
    """Two workers whose --workspace differs by rank, as node-local ones do: the first run trains (rank 0
    writes the state in its own), the second must not train rank 0 from epoch 1 and rank 1 from scratch."""
    command = two_gloo_workers('sh', '-c', 'exec "$@" --workspace "$WORKSPACES/ws$HOROVOD_RANK"', 'sh',
                               sys.executable, os.path.join(ROOT, 'train.py'), *digits_flags(digits, 32),
                               '--kv-store', 'horovod', '--data-backend', 'synthetic', '--num-layers', '10',
                               '--num-examples', '64', '--seed', '3', '--mode', 'train')
    environ = dict(RUN_ENV, WORKSPACES=str(tmp_path))
    first = subprocess.run(command + ['--num-epochs', '2', '--run-epochs', '1'], capture_output=True, text=True,
                           env=environ)
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
