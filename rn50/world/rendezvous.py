"""How the workers find each other, and the check that they did: what each launcher announces to a worker
(the runner's -n in RN50_WORKERS, srun's SLURM_* of the step, horovodrun's HOROVOD_*, mpirun's OMPI_COMM_WORLD_*
or PMI_*), srun's tasks joined over Gloo where Horovod has no MPI to read them, and the world Horovod formed
compared with what was announced. workers.Communicator.start calls, around hvd.init():

    if not hvd.mpi_built() and rendezvous.srun_task_of_many(environ):
        server = rendezvous.join_slurm_world_over_gloo(environ)   # HOROVOD_* set as horovodrun's Gloo launch would
    rendezvous.check_world(comm, environ)    # RecipeError unless the world formed is the one announced

The world is checked as soon as Horovod has formed it, before anything reads or writes a file: a worker
that Horovod counts differently from what its launchers announced would otherwise train alone on the whole
batch and write the same files as its peers (a Horovod without MPI under srun does exactly that).
"""
import os
import re

from rn50.errors import RecipeError
from rn50.launch.nodes import slurm_task_counts

# Set by the runner: how many worker processes it asked for (-n with --kv-store horovod, 1 with --kv-store
# device), so that each worker can check the world it finds itself in.
EXPECTED_WORKERS = 'RN50_WORKERS'


# Each launcher's variables: size, rank, local rank, workers on the node (None: it does not set one).
LAUNCHER_VARIABLES = [
    ('horovodrun', 'HOROVOD_SIZE', 'HOROVOD_RANK', 'HOROVOD_LOCAL_RANK', 'HOROVOD_LOCAL_SIZE'),
    ('mpirun', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK',
     'OMPI_COMM_WORLD_LOCAL_SIZE'),
    ('PMI', 'PMI_SIZE', 'PMI_RANK', None, None)]


WORLD_ADVICE = ('Under SLURM, start every task with srun: srun --mpi=pmix -N 2 --ntasks-per-node 8 ./runner -n 16 '
                '--launcher slurm (an MPI-built Horovod, as in NVIDIA\'s container, needs that PMI; one without MPI '
                'joins the tasks over Gloo from srun\'s SLURM_STEP_* variables); or let horovodrun start them: '
                './runner -n 16 -H host1:8,host2:8 (or --hostfile FILE). Nothing was written')


def srun_task_of_many(environ):
    """Whether srun started this process as one of several tasks, with no other launcher in between."""
    launched = any(environ.get(variables[1]) for variables in LAUNCHER_VARIABLES)
    tasks = environ.get('SLURM_STEP_NUM_TASKS') or environ.get('SLURM_NTASKS') or '1'
    return (environ.get('SLURM_STEP_ID') is not None and not launched and tasks.isdigit() and int(tasks) > 1
            and environ.get('SLURM_PROCID', '').isdigit() and environ.get('SLURM_LOCALID', '').isdigit())


def join_slurm_world_over_gloo(environ):
    """A Horovod without MPI cannot read srun's world, so translate it into the variables horovodrun's Gloo
    launch gives each worker (horovod/runner/gloo_run.py: rank, size, local and cross ranks and sizes, the
    rendezvous server's address), in os.environ, where Horovod reads them. Task 0 serves the rendezvous, as
    horovodrun does, on a port both sides derive from the job and step ids (RN50_RENDEZVOUS_PORT overrides
    it), on the step's first node; the other tasks wait until it answers. Returns task 0's server, or None.
    Tasks are assumed placed by srun's default block distribution (task 0 on the step's first node)."""
    counts = tasks_per_node(environ)
    node = int(environ.get('SLURM_NODEID', '0') or 0)
    rank, local_rank = int(environ['SLURM_PROCID']), int(environ['SLURM_LOCALID'])
    if not counts or node >= len(counts) or local_rank >= counts[node] or sum(counts) != int(
            environ.get('SLURM_STEP_NUM_TASKS') or environ['SLURM_NTASKS']):
        return None    # the layout is not readable: the world check reports what Horovod formed
    hosts = [f'slurm-node{i}' for i in range(len(counts))]
    port = int(environ.get('RN50_RENDEZVOUS_PORT') or
               20000 + (int(environ.get('SLURM_JOB_ID', '0') or 0) * 16 + int(environ['SLURM_STEP_ID'])) % 20000)
    address = first_host(environ.get('SLURM_STEP_NODELIST') or environ.get('SLURM_NODELIST') or 'localhost')
    variables = {
        'HOROVOD_HOSTNAME': hosts[node], 'HOROVOD_RANK': rank, 'HOROVOD_SIZE': sum(counts),
        'HOROVOD_LOCAL_RANK': local_rank, 'HOROVOD_LOCAL_SIZE': counts[node],
        'HOROVOD_CROSS_RANK': sum(count > local_rank for count in counts[:node]),
        'HOROVOD_CROSS_SIZE': sum(count > local_rank for count in counts),
        'HOROVOD_GLOO_RENDEZVOUS_ADDR': address, 'HOROVOD_GLOO_RENDEZVOUS_PORT': port,
        'HOROVOD_CONTROLLER': 'gloo', 'HOROVOD_CPU_OPERATIONS': 'gloo'}
    os.environ.update({name: str(value) for name, value in variables.items()})
    if rank == 0:
        return serve_rendezvous(port, hosts, counts)
    wait_for_rendezvous(address, port)
    return None


def tasks_per_node(environ):
    """The tasks of each node of the step, from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1"
    is [2, 2, 2, 1]); [] where SLURM does not say."""
    return slurm_task_counts(environ.get('SLURM_STEP_TASKS_PER_NODE') or environ.get('SLURM_TASKS_PER_NODE'))


def first_host(nodelist):
    """The first host of a SLURM host list: "gpu[07-08,11],cpu1" -> "gpu07"."""
    match = re.match(r'([^,\[]*)(?:\[([^-,\]]*)[^\]]*\])?([^,]*)', nodelist)
    return ''.join(part or '' for part in match.groups())


def serve_rendezvous(port, hosts, counts):
    """Horovod's own rendezvous server (the one horovodrun runs), on `port`, for this layout of tasks."""
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    try:
        server = RendezvousHTTPServer(('', port), RendezvousHandler, False)
    except OSError as e:
        raise RecipeError(f'task 0 cannot serve the workers\' rendezvous on port {port} ({e.strerror}): set '
                          'RN50_RENDEZVOUS_PORT to a free port for this job') from None
    size = sum(counts)
    server.init([SlotInfo(hostname=host, rank=0, local_rank=local_rank, cross_rank=0, size=size, local_size=count,
                          cross_size=sum(c > local_rank for c in counts))
                 for host, count in zip(hosts, counts) for local_rank in range(count)])
    import threading
    threading.Thread(target=server.serve_forever, name='rendezvous', daemon=True).start()
    return server


def wait_for_rendezvous(address, port, timeout=120):
    """Until task 0's rendezvous server accepts connections (Horovod's own client gives up after a few
    tries, and task 0 may start later than this one)."""
    import socket
    import time
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=5).close()
            return
        except OSError as e:
            if time.time() > deadline:
                raise RecipeError(f'task 0\'s rendezvous server {address}:{port} did not answer within {timeout} '
                                  f's ({e.strerror or e}): is task 0 running, and the port open between the '
                                  'nodes?') from None
            time.sleep(0.2)


def announced_worlds(environ):
    """What the launchers of this process announced, as (who, size, rank, local rank, local size) with None
    where one does not say. SLURM's variables count only in a task srun started itself (SLURM_STEP_ID) and
    not below horovodrun or mpirun: in a batch script, or inside an allocation, they describe the allocation."""
    def number(name):
        value = environ.get(name, '').strip() if name else ''
        return int(value) if value.isdigit() else None
    launchers = []
    for who, size, rank, local_rank, local_size in LAUNCHER_VARIABLES:
        if number(size) is not None:
            launchers.append((f'{who} ({size})', number(size), number(rank), number(local_rank),
                              number(local_size)))
    srun_task = environ.get('SLURM_STEP_ID') is not None or environ.get('SLURM_STEPID') is not None
    tasks = number('SLURM_STEP_NUM_TASKS') or number('SLURM_NTASKS')
    if srun_task and tasks is not None and not launchers:
        launchers.append(('srun (SLURM_NTASKS)', tasks, number('SLURM_PROCID'), number('SLURM_LOCALID'),
                          uniform_tasks_per_node(environ)))
    if number(EXPECTED_WORKERS) is not None:
        launchers.insert(0, ('the runner (-n)', number(EXPECTED_WORKERS), None, None, None))
    return launchers


def uniform_tasks_per_node(environ):
    """The number of tasks SLURM runs on each node when it is the same on every node of the step, else None.
    SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE read "8(x2)" or "8,4"; SLURM_NTASKS_PER_NODE "8"."""
    for name in ('SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE', 'SLURM_NTASKS_PER_NODE'):
        counts = set(slurm_task_counts(environ.get(name)))
        if counts:
            return counts.pop() if len(counts) == 1 else None
    return None


def check_world(comm, environ):
    """RecipeError (before any file is read or written) when the world Horovod formed (`comm`, a Communicator:
    rank, size, local rank and size, horovod) is not the one this process's launchers announced: its size, this
    worker's rank, local rank and the workers on its node."""
    mismatches = []
    for who, size, rank, local_rank, local_size in announced_worlds(environ):
        pairs = [('rank', rank, comm.rank), ('local rank', local_rank, comm.local_rank),
                 ('workers on this node', local_size, comm.local_size)]
        if size != comm.size or any(said is not None and said != found for _, said, found in pairs):
            mismatches.append(f'{who} says {size} workers' + ''.join(f', {label} {said}' for label, said, _ in pairs
                                                                      if said is not None))
    if mismatches:
        formed = 'Horovod' if comm.horovod is not None else '--kv-store device (one process)'
        counted = f'{comm.size} worker{"s" if comm.size > 1 else ""}'
        raise RecipeError(f'{formed} formed a world of {counted} (this one: rank {comm.rank}, local rank '
                          f'{comm.local_rank}, {comm.local_size} on its node) but {"; ".join(mismatches)}: the '
                          f'workers did not find each other, and each would train on its own. {WORLD_ADVICE}')
