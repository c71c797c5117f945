"""Who this process is among the workers: the Communicator of their collectives, which holds this worker's rank,
size, local rank and size; the World record a run is given; the seed they share. What this module finds out is
run state, returned as records; the flags stay as rn50/config/resolve.py resolved them.

train.py calls, before the model exists:

    comm = workers.Communicator.start(args.kv_store)      # starts Horovod (rank, size, local rank), checked; or one
    world = workers.World(comm, devices.resolve_devices(comm, devices.DeviceRequest.of(args)), start_time)
                      # the frozen record the rest of the run is given; its Devices from rn50/world/devices.py
    seed = workers.resolve_seed(args.seed, world)         # one seed for every worker, the RNGs seeded from it

A World is a record (its Communicator, the devices and their precision, the start time); its `comm` holds the
worker's rank, size, local rank and size, which the World reads (world.rank), and does the collectives
(world.comm.allreduce_sum(...)). A test builds the record itself, `workers.World(workers.Communicator(rank=1,
size=2))`, or `workers.World()`: one worker, no collectives.

How the workers find each other under each launcher, and the check of the world Horovod formed, are
rendezvous.py's; the devices are devices.py's, AMP's precision precision.py's.
"""
import dataclasses
import importlib
import os
import time

import mxnet as mx
import numpy as np

from rn50.errors import RecipeError
from rn50.world import rendezvous
from rn50.world.devices import Devices


class Communicator:
    """The collectives the recipe needs among the workers (sum, gather, barrier, broadcasts, averaged copies),
    over `horovod` (horovod.mxnet, started) for this worker of rank `rank` among `size` (`local_rank` of
    `local_size` on its node: the one place these four are kept, World reads them here); with one worker none is
    needed, and each is the identity. `start` forms the world of a run. `rendezvous_server`: task 0's rendezvous
    server under srun with a Gloo-only Horovod (rendezvous.join_slurm_world_over_gloo), kept while it serves."""

    def __init__(self, horovod=None, rank=0, size=1, local_rank=0, local_size=1, rendezvous_server=None):
        self.horovod, self.rendezvous_server = horovod, rendezvous_server
        self.rank, self.size, self.local_rank, self.local_size = rank, size, local_rank, local_size

    @classmethod
    def start(cls, kv_store, environ=os.environ, load_first=()):
        """The Communicator of this process: with --kv-store horovod (`kv_store`), Horovod started, one worker
        per device; otherwise a single worker. Checked against what the launchers announced
        (rendezvous.check_world). `load_first`: modules of the run's optional features that must load before
        Horovod, like DALI and Pillow below (tensorboardX, which imports PyTorch where it is installed: a PyTorch
        imported after horovod.mxnet segfaults, torch 2.14.1)."""
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
            server = None
            if not hvd.mpi_built() and rendezvous.srun_task_of_many(environ):
                environ = dict(environ)      # the check below compares with what srun announced
                server = rendezvous.join_slurm_world_over_gloo(environ)
            check_horovod_api(hvd)
            hvd.init()
            comm = cls(hvd, hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), server)
        rendezvous.check_world(comm, environ)
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


def resolve_seed(seed, world):
    """One seed for every worker, returned: `seed` (--seed), else rank 0's random pick (a new training run logs it,
    a resumed one takes its own; stored in checkpoints). NumPy's and MXNet's generators are seeded from it."""
    seed = seed if seed is not None else world.comm.broadcast_int(int.from_bytes(os.urandom(3), 'little'))
    np.random.seed(seed)
    mx.random.seed(seed + world.rank)
    return seed
