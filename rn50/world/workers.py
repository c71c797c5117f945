"""Who this process is and what it runs on: the worker world, its devices and AMP, the seed. What this module
finds out is run state, returned as records; the flags stay as rn50/config/resolve.py resolved them.

train.py calls, before the model exists:

    comm = workers.Communicator.start(args.kv_store)      # starts Horovod (rank, size, local rank), checked; or one
    devices = workers.resolve_devices(comm, workers.DeviceRequest.of(args))   # contexts, 'gpu' or 'cpu', AMP's dtype
    world = workers.World(comm, devices, start_time)      # the frozen record the rest of the run is given
    seed = workers.resolve_seed(args.seed, world)         # one seed for every worker, the RNGs seeded from it

A World is a record (its Communicator, the devices and their precision, the start time); its `comm` holds the
worker's rank, size, local rank and size, which the World reads (world.rank), and does the collectives
(world.comm.allreduce_sum(...)). A test builds the record itself, `workers.World(workers.Communicator(rank=1,
size=2))`, or `workers.World()`: one worker, no collectives.

The flags' defaults that depend on the machine (float32 and dali-cpu without a GPU) are resolve.py's; an
explicit request this machine cannot honour (--gpus on a CPU machine, bfloat16 on a CPU without AVX-512) is a
RecipeError here.

The world is checked as soon as Horovod has formed it, before anything reads or writes a file: a worker
that Horovod counts differently from what its launchers announced (the runner's -n in RN50_WORKERS, srun's
SLURM_* of the step, horovodrun's HOROVOD_*, mpirun's OMPI_COMM_WORLD_* or PMI_*) would otherwise train alone
on the whole batch and write the same files as its peers (a Horovod without MPI under srun does exactly that).
"""
import dataclasses
import hashlib
import importlib
import logging
import os
import re
import socket
import time

import mxnet as mx
import numpy as np

from rn50.errors import RecipeError
from rn50.world import cpu

log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class Devices:
    """What a worker runs on (resolve_devices): the MXNet contexts it drives (one, or with --kv-store device
    every GPU of --gpus), their kind ('gpu' or 'cpu'), and AMP's dtype (--amp: 'float16' on GPUs, 'bfloat16' on
    the CPU; None without AMP)."""
    contexts: tuple = (mx.cpu(),)
    kind: str = 'cpu'
    amp_dtype: str = None


class Communicator:
    """The collectives the recipe needs among the workers (sum, gather, barrier, broadcasts, averaged copies),
    over `horovod` (horovod.mxnet, started) for this worker of rank `rank` among `size` (`local_rank` of
    `local_size` on its node: the one place these four are kept, World reads them here); with one worker none is
    needed, and each is the identity. `start` forms the world of a run. `rendezvous`: task 0's rendezvous server under srun with a Gloo-only Horovod."""

    def __init__(self, horovod=None, rank=0, size=1, local_rank=0, local_size=1, rendezvous=None):
        self.horovod, self.rendezvous = horovod, rendezvous
        self.rank, self.size, self.local_rank, self.local_size = rank, size, local_rank, local_size

    @classmethod
    def start(cls, kv_store, environ=os.environ, load_first=()):
        """The Communicator of this process: with --kv-store horovod (`kv_store`), Horovod started, one worker
        per device; otherwise a single worker. Checked against what the launchers announced (check_world).
        `load_first`: modules of the run's optional features that must load before Horovod, like DALI and Pillow
        below (tensorboardX, which imports PyTorch where it is installed: a PyTorch imported after horovod.mxnet
        segfaults, torch 2.14.1)."""
        comm = cls()
        if kv_store == 'horovod':
            try:
                # DALI must be loaded before Horovod: the other order makes DALI pipelines crash (seen with
                # DALI 1.34 and Horovod 0.28.1: segfault at the first pipeline run, conflicting native libs).
                import nvidia.dali  # noqa: F401
            except ImportError:
                pass
            # Pillow too (records.find_undecodable): horovod.mxnet loads libmxnet's symbols globally, its libjpeg
            # among them, and a Pillow loaded after it decodes no JPEG at all ('broken data stream').
            import PIL.Image  # noqa: F401
            for module in load_first:
                importlib.import_module(module)
            try:
                import horovod.mxnet as hvd
            except ImportError as e:
                raise RecipeError(f'--kv-store horovod needs Horovod built with MXNet support ({e}); run '
                                  '`make setup`, or use --kv-store device for a single process') from e
            rendezvous = None
            if not hvd.mpi_built() and srun_task_of_many(environ):
                environ = dict(environ)      # the check below compares with what srun announced
                rendezvous = join_slurm_world_over_gloo(environ)
            check_horovod_api(hvd)
            hvd.init()
            comm = cls(hvd, hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), rendezvous)
        check_world(comm, environ)
        return comm

    def allreduce_sum(self, values):
        """Sum a small float64 vector over all workers (identity with one worker)."""
        values = np.asarray(values, dtype=np.float64)
        if self.size == 1:
            return values
        total = self.horovod.allreduce(mx.nd.array(values, dtype='float64'), name=f'sum{len(values)}',
                                       **horovod_sum(self.horovod))
        return total.asnumpy()

    def gather(self, values):
        """Every worker's float32 vector (all of one length), as the rows of a (workers, N) array."""
        values = np.asarray(values, dtype=np.float32).reshape(1, -1)
        if self.size == 1:
            return values
        return self.horovod.allgather(mx.nd.array(values), name=f'gather{values.shape[1]}').asnumpy()

    def barrier(self):
        """Wait until every worker gets here."""
        self.allreduce_sum([0.0])

    def average_copies(self, groups):
        """Each group (the copies of one array on this worker's devices) set to the mean of its copies over all
        devices and workers, in place: a collective. With several workers each normalises its own batches, so
        each device's batchnorm running statistics differ; averaged before every validation and save, the
        accuracy reported is that of the model saved (MLPerf does the same)."""
        if not groups or (self.size == 1 and all(len(copies) == 1 for copies in groups)):
            return
        flat = np.concatenate([np.mean([c.asnumpy().astype(np.float64) for c in copies], axis=0).ravel()
                               for copies in groups])
        mean = self.allreduce_sum(flat) / self.size
        offset = 0
        for copies in groups:
            size = copies[0].size
            value = mean[offset:offset + size].reshape(copies[0].shape)
            offset += size
            for copy in copies:
                copy[:] = mx.nd.array(value, ctx=copy.context, dtype=copy.dtype)

    def differing_ranks(self, values):
        """The ranks whose `values` (a float32 vector, the same length on every worker) differ from rank 0's:
        a collective, every worker gets the same answer."""
        if self.size == 1:
            return []
        rows = self.gather(values)
        return [rank for rank, row in enumerate(rows) if not np.array_equal(row, rows[0])]

    # Broadcasts are all-reduces here: rank 0 contributes its values, every other rank zeros (x + 0 = x,
    # exactly). Horovod 0.28.1's own broadcast hands the op to its background thread and then logs the op's
    # name, which that thread may already have freed on completion: a use-after-free that crashed about one
    # start in 25 with 2 Gloo workers (gdb: EnqueueTensorBroadcast's "Enqueued" log line, operations.cc).
    # Its all-reduce logs before it enqueues.

    def broadcast_int(self, value):
        """Rank 0's value of an integer, on every worker (exact up to 2**53)."""
        return int(self.allreduce_sum([value if self.rank == 0 else 0])[0])

    def broadcast_text(self, text, root=0):
        """Worker `root`'s `text` on every worker (the others' is ignored): an error in the words of the worker
        that met it. Two all-reduces, the length and the UTF-8 bytes."""
        data = text.encode() if self.rank == root else b''
        length = int(self.allreduce_sum([len(data)])[0])
        if self.size == 1 or length == 0:
            return data.decode()
        values = np.frombuffer(data, dtype=np.uint8) if self.rank == root else np.zeros(length)
        return bytes(self.allreduce_sum(values).astype(np.uint8)).decode()

    def broadcast_parameters(self, params):
        """Rank 0's values of every parameter in `params` (a gluon ParameterDict), in place on every
        worker; returns once they are there."""
        if self.size == 1:
            return
        arrays = [param.data() for _, param in sorted(params.items())]
        if self.rank != 0:
            for array in arrays:
                array[:] = 0
        if hasattr(self.horovod, 'grouped_allreduce_'):
            self.horovod.grouped_allreduce_(arrays, name='broadcast_parameters', **horovod_sum(self.horovod))
        else:   # Horovod before 0.21 has no grouped all-reduce
            for index, array in enumerate(arrays):
                self.horovod.allreduce_(array, name=f'broadcast_parameters.{index}', **horovod_sum(self.horovod))
        mx.nd.waitall()


@dataclasses.dataclass(frozen=True)
class World:
    """Who this worker is and what it runs on, a record: `comm`, the Communicator of its collectives (by default
    one worker's, which needs none), which holds its rank among the workers and on its node (read here as
    `rank`, `size`, `local_rank`, `local_size`); its `devices` (a Devices: contexts, kind and AMP's precision);
    and when the process started (`start_time`, time.time()). With --kv-store horovod there is one worker per
    device; otherwise one."""
    comm: Communicator = dataclasses.field(default_factory=Communicator)
    devices: Devices = Devices()
    start_time: float = dataclasses.field(default_factory=time.time)

    @property
    def rank(self):
        return self.comm.rank

    @property
    def size(self):
        return self.comm.size

    @property
    def local_rank(self):
        return self.comm.local_rank

    @property
    def local_size(self):
        return self.comm.local_size


# What the recipe calls in horovod.mxnet: present in every release from 0.20 (NVIDIA's MXNet containers 20.x
# to 22.x) to 0.28; `op=`/`Sum` and `grouped_allreduce_` are used where they exist (horovod_sum, Communicator).
HOROVOD_API = ('init', 'rank', 'size', 'local_rank', 'local_size', 'mpi_built', 'allreduce', 'allreduce_',
               'allgather', 'DistributedTrainer')


def check_horovod_api(hvd):
    """A RecipeError naming what this Horovod lacks of HOROVOD_API (the Dockerfile's build calls it too)."""
    missing = [name for name in HOROVOD_API if not hasattr(hvd, name)]
    if missing:
        raise RecipeError(f'This Horovod lacks '
                          f'{", ".join(missing)}, which this recipe calls: use Horovod 0.20 to 0.28 '
                          '(NVIDIA MXNet containers 20.12 to 22.10 ship one)')


def horovod_sum(hvd):
    """The keyword that makes a Horovod all-reduce a sum: `op=hvd.Sum` from Horovod 0.25 on (where `average`
    is deprecated), `average=False` before (NVIDIA's MXNet containers up to 22.05 ship 0.23-0.24, which have
    no `op` and no `Sum`: calling them with `op=` fails at the first collective)."""
    return {'op': hvd.Sum} if hasattr(hvd, 'Sum') else {'average': False}


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
    text = environ.get('SLURM_STEP_TASKS_PER_NODE') or environ.get('SLURM_TASKS_PER_NODE') or ''
    counts = []
    for match in re.finditer(r'([0-9]+)(?:\(x([0-9]+)\))?', text):
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


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
        counts = {int(m.group(1)) for m in re.finditer(r'([0-9]+)(?:\(x[0-9]+\))?', environ.get(name, ''))}
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


@dataclasses.dataclass(frozen=True)
class DeviceRequest:
    """What the flags ask of a worker's devices (`of`): the global batch, --gpus (None: every GPU the process
    sees), one worker per device (--kv-store horovod), INT8 on the CPU (--quantize int8), --amp, and whether
    the run is inference (val, pred: AMP converts the network then, instead of being initialised)."""
    batch_size: int
    gpus: tuple = None
    horovod: bool = False
    int8: bool = False
    amp: bool = False
    inference: bool = False

    @classmethod
    def of(cls, args):
        return cls(batch_size=args.batch_size, gpus=None if args.gpus is None else tuple(args.gpus),
                   horovod=args.kv_store == 'horovod', int8=bool(args.quantize), amp=args.amp,
                   inference=args.mode in ('val', 'pred'))


def resolve_devices(comm, request):
    """The Devices of this worker (`comm`, its Communicator), as `request` (a DeviceRequest) asks, before the
    model is built: its contexts (checked against the batch and the node's other workers) and AMP's dtype, with
    AMP initialised for it."""
    num_gpus = 0 if request.int8 else mx.context.num_gpus()   # INT8 on the CPU, a GPU node's too (resolve.py)
    contexts = tuple(devices(request, comm, num_gpus))
    on_gpu = num_gpus > 0
    if on_gpu and comm.size > 1:
        check_one_worker_per_gpu(comm, contexts)
    per_worker = request.batch_size // comm.size   # divisibility by the workers: contract.per_worker_batch
    if per_worker % len(contexts):
        raise RecipeError(f'the per-worker batch {per_worker} is not divisible by its '
                          f'{len(contexts)} devices')
    if on_gpu:
        log.info(devices_line(request.batch_size, comm, contexts))
    return Devices(contexts, 'gpu' if on_gpu else 'cpu', start_amp(request.amp, on_gpu, request.inference))


def devices_line(batch_size, comm, contexts):
    """What this worker trains on, said because a single process takes every GPU it sees: `python train.py
    -b 32` on an 8-GPU node gives each GPU 4 images (and batchnorm statistics over 4)."""
    ids = ','.join(str(ctx.device_id) for ctx in contexts)
    per_gpu = batch_size // comm.size // len(contexts)
    who = f'Worker {comm.rank} of {comm.size}' if comm.size > 1 else 'This process'
    return (f'{who} trains on GPU{"s" if len(contexts) > 1 else ""} {ids}: {per_gpu} images per GPU of the '
            f'global batch {batch_size} (batchnorm statistics over {per_gpu} images)')


def devices(request, comm, num_gpus):
    """The contexts this worker drives: the CPU on a machine without GPUs; else --gpus (default: every GPU
    this process sees), of which a Horovod worker takes the one of its local rank; a Horovod worker that sees
    a single GPU of its own (SLURM's per-task binding) takes it, device 0, whatever its local rank. `request`:
    a DeviceRequest; `comm`: the worker's Communicator (its local rank and size)."""
    if request.gpus is not None and any(g >= num_gpus for g in request.gpus):
        raise RecipeError(f'--gpus {",".join(map(str, request.gpus))} asks for GPUs this machine does not have '
                          f'({num_gpus} found); leave --gpus out to train on the CPU')
    if num_gpus == 0:
        if request.gpus is None:
            log.info('INT8 (--quantize): running on the CPU' if request.int8 else 'No GPU found: running on the CPU')
        # Each Horovod worker of a node on a device id of its own, as each takes gpu(local rank) on a GPU node:
        # the CPU runs the per-device code of a multi-GPU run (optimizer counts, states and copies by device).
        return [mx.cpu(comm.local_rank if request.horovod else 0)]
    gpus = request.gpus if request.gpus is not None else list(range(num_gpus))
    if not request.horovod:
        return [mx.gpu(g) for g in gpus]
    if num_gpus == 1 and comm.local_size > 1:
        # Each task sees one GPU: bound per task by SLURM (--gpus-per-task, --gpu-bind) or by its own
        # CUDA_VISIBLE_DEVICES, or one GPU shared by all (a job-wide --gres=gpu:1): check_one_worker_per_gpu
        # tells them apart by comparing the physical GPUs of the node's workers.
        return [mx.gpu(0)]
    if len(gpus) < comm.local_size:
        raise RecipeError(f'{comm.local_size} workers run on this node and it has {len(gpus)} GPUs for them '
                          f'(--gpus {",".join(map(str, gpus))}, {num_gpus} visible): start one worker per GPU, or '
                          'bind one GPU to each task')
    return [mx.gpu(gpus[comm.local_rank])]


def physical_gpu(ctx, environ=os.environ):
    """The GPU behind `ctx` as the node knows it: its entry in CUDA_VISIBLE_DEVICES (an index or a UUID),
    else its index."""
    visible = [entry.strip() for entry in environ.get('CUDA_VISIBLE_DEVICES', '').split(',') if entry.strip()]
    return visible[ctx.device_id] if ctx.device_id < len(visible) else str(ctx.device_id)


def gpu_key(host, gpu):
    """(host, GPU) as two integers that float32 holds exactly, for Communicator.gather."""
    digest = hashlib.sha256(f'{host}/{gpu}'.encode()).digest()
    return [int.from_bytes(digest[:3], 'little'), int.from_bytes(digest[3:6], 'little')]


def check_one_worker_per_gpu(comm, contexts, environ=os.environ):
    """RecipeError on every worker when two workers of a node drive the same GPU (SLURM's job-wide
    CUDA_VISIBLE_DEVICES of `--ntasks-per-node 2 --gres=gpu:1` shows both tasks the same GPU as device 0):
    they would train side by side on it, each at half speed, without a word. A collective of `comm`."""
    host = socket.gethostname()
    mine = [gpu_key(host, physical_gpu(ctx, environ)) for ctx in contexts]
    rows = comm.gather(np.asarray(mine, dtype=np.float32).ravel())
    keys = [tuple(row[i:i + 2]) for row in rows for i in range(0, len(row), 2)]
    shared = {key for key in keys if keys.count(key) > 1}
    if shared:
        which = ', '.join(physical_gpu(ctx, environ) for ctx, key in zip(contexts, mine) if tuple(key) in shared)
        raise RecipeError(f'several workers train on the same GPU ({which} on {host}, as CUDA_VISIBLE_DEVICES='
                          f'{environ.get("CUDA_VISIBLE_DEVICES", "(unset)")} shows it): give every task of a node '
                          'all its GPUs (srun --gpus-per-node 8 --ntasks-per-node 8, or --gres=gpu:8) and each '
                          'worker takes the one of its local rank, or bind one GPU to each task '
                          '(--gpus-per-task 1); nothing was written')


def start_amp(amp, on_gpu, inference=False):
    """--amp's dtype (`amp`: the flag; float16 on GPU, bfloat16 on CPU; the network stays float32, resolve.py made
    --dtype float32), with mxnet.contrib.amp initialised for it; None without --amp. Inference on the CPU
    (`inference`: val, pred) does not initialise AMP: it converts the trained network to bfloat16 as a whole and
    fuses it then (inference.fused_bfloat16), as AMP's casts between the operators would keep oneDNN from fusing
    them."""
    if not amp:
        return None
    amp_dtype = 'float16' if on_gpu else 'bfloat16'
    if amp_dtype == 'bfloat16':
        check_cpu_bfloat16(inference=inference)
    if on_gpu or not inference:
        from mxnet.contrib import amp
        amp.init(target_dtype=amp_dtype)
    return amp_dtype


def check_cpu_bfloat16(inference=False):
    """oneDNN runs bfloat16 fast on AMX, natively with avx512_bf16 alone (training at a speed that depends on
    the CPU, inference of the fused bfloat16 network fast), emulated on other AVX-512 CPUs, and not at all on
    AVX2-only CPUs (it fails deep inside with 'could not create a primitive descriptor'). What may be slower
    than float32 is said once, with the reason."""
    flags = cpu.cpu_flags()
    if 'avx512f' not in flags:
        raise RecipeError('--amp on the CPU means bfloat16, which needs an AVX-512 CPU (fast with AMX) and this '
                          'CPU has none: train in float32 (leave out --amp)')
    warning = cpu.bfloat16_speed_warning(flags, inference=inference)
    if warning:
        log.warning(warning)


def resolve_seed(seed, world):
    """One seed for every worker, returned: `seed` (--seed), else rank 0's random pick (a new training run logs it,
    a resumed one takes its own; stored in checkpoints). NumPy's and MXNet's generators are seeded from it."""
    seed = seed if seed is not None else world.comm.broadcast_int(int.from_bytes(os.urandom(3), 'little'))
    np.random.seed(seed)
    mx.random.seed(seed + world.rank)
    return seed
