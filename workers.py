"""Who this process is and what it runs on: the worker world, devices, precision and AMP, seeds.

train.py calls, before the model exists:

    world = workers.World(args.kv_store)       # Horovod worker (rank, size, local rank) or a single process
    workers.resolve_hardware(args, world)      # args.contexts, args.device, args.dtype, args.amp_dtype
    workers.resolve_seed(args, world)          # one seed for every worker, the RNGs seeded from it

Defaults adapt to the machine and say so once (no GPU: float32 on the CPU); an explicit request this
machine cannot honour (float16 or --gpus on a CPU machine, bfloat16 on a CPU without AVX-512) is a
RecipeError.
"""
import logging
import os

import mxnet as mx
import numpy as np

import cpu
from errors import RecipeError

log = logging.getLogger(__name__)

# MXNet seeds are 32-bit signed integers and worker r seeds with seed + r: room for 65,536 workers.
MAX_SEED = 2**31 - 1 - 65536


class World:
    """Who this process is among the workers, and the collectives the recipe needs (sum, gather, barrier,
    broadcast).

    With --kv-store horovod there is one worker per device; otherwise a single worker."""

    def __init__(self, kv_store):
        self.horovod = None
        self.rank, self.size, self.local_rank = 0, 1, 0
        if kv_store == 'horovod':
            try:
                # DALI must be loaded before Horovod: the other order makes DALI pipelines crash (seen with
                # DALI 1.34 and Horovod 0.28.1: segfault at the first pipeline run, conflicting native libs).
                import nvidia.dali  # noqa: F401
            except ImportError:
                pass
            try:
                import horovod.mxnet as hvd
            except ImportError as e:
                raise RecipeError(f'--kv-store horovod needs Horovod built with MXNet support ({e}); run '
                                  '`make setup`, or use --kv-store device for a single process') from e
            hvd.init()
            self.horovod = hvd
            self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()

    def allreduce_sum(self, values):
        """Sum a small float64 vector over all workers (identity with one worker)."""
        values = np.asarray(values, dtype=np.float64)
        if self.size == 1:
            return values
        total = self.horovod.allreduce(mx.nd.array(values, dtype='float64'), op=self.horovod.Sum,
                                       name=f'sum{len(values)}')
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

    # Broadcasts are all-reduces here: rank 0 contributes its values, every other rank zeros (x + 0 = x,
    # exactly). Horovod 0.28.1's own broadcast hands the op to its background thread and then logs the op's
    # name, which that thread may already have freed on completion: a use-after-free that crashed about one
    # start in 25 with 2 Gloo workers (gdb: EnqueueTensorBroadcast's "Enqueued" log line, operations.cc).
    # Its all-reduce logs before it enqueues.

    def broadcast_int(self, value):
        """Rank 0's value of an integer, on every worker (exact up to 2**53)."""
        return int(self.allreduce_sum([value if self.rank == 0 else 0])[0])

    def broadcast_parameters(self, params):
        """Rank 0's values of every parameter in `params` (a gluon ParameterDict), in place on every
        worker; returns once they are there."""
        if self.size == 1:
            return
        arrays = [param.data() for _, param in sorted(params.items())]
        if self.rank != 0:
            for array in arrays:
                array[:] = 0
        self.horovod.grouped_allreduce_(arrays, op=self.horovod.Sum, name='broadcast_parameters')
        mx.nd.waitall()


def resolve_hardware(args, world):
    """Decide devices, precision and AMP before the model is built. Sets args.contexts, args.device,
    args.dtype and args.amp_dtype."""
    num_gpus = mx.context.num_gpus()
    args.contexts = devices(args, world, num_gpus)
    on_gpu = num_gpus > 0
    args.device = 'gpu' if on_gpu else 'cpu'
    resolve_precision(args, on_gpu)
    per_worker = args.batch_size // world.size   # divisibility by the workers: data.per_worker_batch
    if per_worker % len(args.contexts):
        raise RecipeError(f'the per-worker batch {per_worker} is not divisible by its '
                          f'{len(args.contexts)} devices')


def devices(args, world, num_gpus):
    """The contexts this worker drives: the CPU on a machine without GPUs; else --gpus (default: every GPU
    for a single process, GPU 0 per node otherwise), one per Horovod worker picked by its local rank."""
    if args.gpus is not None and any(g >= num_gpus for g in args.gpus):
        raise RecipeError(f'--gpus {",".join(map(str, args.gpus))} asks for GPUs this machine does not have '
                          f'({num_gpus} found); leave --gpus out to train on the CPU')
    if num_gpus == 0:
        if args.gpus is None:
            log.info('No GPU found: running on the CPU')
        return [mx.cpu()]
    gpus = args.gpus if args.gpus is not None else list(range(num_gpus if world.size == 1 else 1))
    if args.kv_store == 'horovod':
        if world.local_rank >= len(gpus):
            raise RecipeError(f'worker with local rank {world.local_rank} has no GPU in --gpus {gpus}')
        gpus = [gpus[world.local_rank]]
    return [mx.gpu(g) for g in gpus]


def resolve_precision(args, on_gpu):
    """--dtype (default float16 on GPU, float32 on CPU) and --amp (float16 on GPU, bfloat16 on CPU, with the
    network kept in float32)."""
    if args.dtype is None:
        args.dtype = 'float16' if on_gpu and not args.amp else 'float32'
        if not on_gpu:
            log.info('No GPU: --dtype defaults to float32 (use --amp for bfloat16 on this CPU)')
    if args.dtype == 'float16' and not on_gpu:
        raise RecipeError('--dtype float16 needs a GPU (MXNet has no fast float16 kernels on CPU); use '
                          '--dtype float32, or --amp for bfloat16 mixed precision on the CPU')
    if not args.amp:
        args.amp_dtype = None
        return
    if args.dtype == 'float16':
        log.info('--amp: the network stays float32 and AMP casts to float16 where it is safe')
    args.dtype = 'float32'
    args.amp_dtype = 'float16' if on_gpu else 'bfloat16'
    if args.amp_dtype == 'bfloat16':
        check_cpu_bfloat16()
    from mxnet.contrib import amp
    amp.init(target_dtype=args.amp_dtype)


def check_cpu_bfloat16():
    """oneDNN runs bfloat16 fast on AMX, natively but slower than float32 with avx512_bf16 alone, emulated on
    other AVX-512 CPUs, and not at all on AVX2-only CPUs (it fails deep inside with 'could not create a
    primitive descriptor'). Slower than float32 is said once, with the reason."""
    flags = cpu.cpu_flags()
    if 'avx512f' not in flags:
        raise RecipeError('--amp on the CPU means bfloat16, which needs an AVX-512 CPU (fast with AMX) and this '
                          'CPU has none: train in float32 (leave out --amp)')
    warning = cpu.bfloat16_speed_warning(flags)
    if warning:
        log.warning(warning)


def resolve_seed(args, world):
    """One seed for every worker: the given one, else rank 0's random pick (logged, stored in checkpoints)."""
    if args.seed is None:
        args.seed = world.broadcast_int(int.from_bytes(os.urandom(3), 'little'))
        log.info('No --seed given: using seed %d', args.seed)
    np.random.seed(args.seed)
    mx.random.seed(args.seed + world.rank)
