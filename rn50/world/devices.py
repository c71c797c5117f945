"""What a worker runs on: the request of the flags (DeviceRequest), the contexts picked for it (worker_contexts:
the CPU, every GPU of --gpus, or the GPU of its local rank), checked against the batch and the node's other
workers, and the record of the result (Devices: contexts, kind, AMP's dtype). train.py calls, once the
Communicator has formed the world and before the model exists:

    world = workers.World(comm, devices.resolve_devices(comm, devices.DeviceRequest.of(args)), start_time)

resolve_devices returns a Devices, with AMP initialised for its precision (precision.start_amp).

An explicit request this machine cannot honour (--gpus on a CPU machine, more workers on a node than its GPUs,
two workers on one GPU) is a RecipeError here; the flags' defaults that depend on the machine (float32 and
dali-cpu without a GPU) are rn50/config/resolve.py's.
"""
import dataclasses
import hashlib
import logging
import os
import socket

import mxnet as mx
import numpy as np

from rn50.errors import RecipeError
from rn50.world import precision

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Devices:
    """What a worker runs on (resolve_devices): the MXNet contexts it drives (one, or with --kv-store device
    every GPU of --gpus), their kind ('gpu' or 'cpu'), and AMP's dtype (--amp: 'float16' on GPUs, 'bfloat16' on
    the CPU; None without AMP)."""
    contexts: tuple = (mx.cpu(),)
    kind: str = 'cpu'
    amp_dtype: str = None


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
    contexts = tuple(worker_contexts(request, comm, num_gpus))
    on_gpu = num_gpus > 0
    if on_gpu and comm.size > 1:
        check_one_worker_per_gpu(comm, contexts)
    per_worker = request.batch_size // comm.size   # divisibility by the workers: contract.per_worker_batch
    if per_worker % len(contexts):
        raise RecipeError(f'the per-worker batch {per_worker} is not divisible by its '
                          f'{len(contexts)} devices')
    if on_gpu:
        log.info(gpu_share_line(request.batch_size, comm, contexts))
    return Devices(contexts, 'gpu' if on_gpu else 'cpu', precision.start_amp(request.amp, on_gpu, request.inference))


def gpu_share_line(batch_size, comm, contexts):
    """What this worker trains on, said because a single process takes every GPU it sees: `python train.py
    -b 32` on an 8-GPU node gives each GPU 4 images (and batchnorm statistics over 4)."""
    ids = ','.join(str(ctx.device_id) for ctx in contexts)
    per_gpu = batch_size // comm.size // len(contexts)
    who = f'Worker {comm.rank} of {comm.size}' if comm.size > 1 else 'This process'
    return (f'{who} trains on GPU{"s" if len(contexts) > 1 else ""} {ids}: {per_gpu} images per GPU of the '
            f'global batch {batch_size} (batchnorm statistics over {per_gpu} images)')


def worker_contexts(request, comm, num_gpus):
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
