"""Checkpoint files: the formats of the weights and training state this recipe writes and reads back. Where they
are (the workspace's names): workspace.py; what a run's states hold and when they are written: saver.py; which
one a run starts from or a mode uses: resume.py; any weights file, of any origin, read into a network:
weight_loading.py (weight_origins.py recognises them, weight_conversion.py converts them).

Written atomically (files.atomic_path: a temporary name flushed to disk, then a rename, so a crash leaves the
old file or the new one, never half of one):

* `.params` (`<prefix>_best.params`, `<prefix>_NNNN.params`, `<prefix>_ema_best.params`): Gluon
  `save_parameters` files (weights and batchnorm statistics, by the network's structural names such as
  `features.stage2.unit1.body.conv2.weight`).
* `.state` (`<prefix>_last.state`, `<prefix>_prev.state`): everything an exact resume needs, one `mx.nd.save`
  dictionary: `param:<name>` arrays, `rank<r>:<name>` batchnorm statistics of every worker (with several
  workers), `trainer` (the optimizer state as bytes: optimizer_state.py), `meta` (JSON bytes: epoch,
  iteration, seed, loss scaler, global batch, workers, best accuracy, metric history, the epoch's loss sums,
  the run's settings (resume.run_settings), preprocessing), with --model-ema the `ema:<name>` float32 averages
  (ema.py), and `checksum` (SHA-256 of all of it). Never written with NaN or infinite parameters (fit.py
  checks first: nonfinite_parameters).

    checkpoint.save_params(net, workspace.best_params)            # saver.py
    checkpoint.save_state(workspace.last_state, net, trainer, meta, previous=workspace.previous_state,
                          worker_statistics=checkpoint.worker_statistics(net, world), extra=average)
    state = checkpoint.read_state(workspace.last_state)           # .params, .trainer, .meta; checksum verified
    checkpoint.load_params_into(net, params, checkpoint.network_contexts(net))   # exactly the network's names
"""
import collections
import functools
import hashlib
import json
import logging
import os
import threading

import mxnet as mx
import numpy as np

from rn50 import files
from rn50.checkpoints import optimizer_state
from rn50.errors import RecipeError, mxnet_message

log = logging.getLogger(__name__)


class State(collections.namedtuple('State', 'params trainer meta worker_statistics extra')):
    """A .state file's contents: parameters by name (NDArrays), the optimizer state (bytes), the meta dict,
    {rank: {name: numpy array}} of every worker's batchnorm statistics (empty with one worker), and the other
    named arrays of optional features ({'ema:<name>': NDArray}); `checksum`, the file's SHA-256 (hex), tells
    the workers of a run whether they read the same state."""
    checksum = None

    def __new__(cls, params, trainer, meta, worker_statistics, extra=None, checksum=None):
        state = super().__new__(cls, params, trainer, meta, worker_statistics, {} if extra is None else extra)
        state.checksum = checksum
        return state


EXTRA_PREFIXES = ('ema:',)


# ----------------------------------------------------------------------------------------------------------
# Writing


class BackgroundWriter:
    """Writes checkpoint files in threads of their own, in the order they were submitted, while training goes
    on: the caller makes the host copies of what a file holds first (MXNet's engine orders those copies before
    any later update of the arrays), the job hashes and writes them (atomically, as every file here). fit.py
    waits for the files of an epoch before it copies the next epoch's, so at most one epoch's copies are held.
    A job's error is raised by `wait`, or when the `with` block ends; the jobs after a failed one are skipped.
    With several workers rank 0 alone writes, and a worker that stops alone leaves the others waiting in their
    next collective: fit.py looks at `failed` in the collectives it makes while the next epoch trains, and waits
    with `wait_agreed`, which raises the error on every worker:

        with checkpoint.BackgroundWriter() as writer:      # fit.train
            checkpoint.save_state(path, net, trainer, meta, writer=writer)
            writer.wait_agreed(world.comm)
    """

    def __init__(self):
        self.threads, self.error = [], None

    def submit(self, job):
        """Queue `job()` after the jobs submitted before it; returns at once."""
        previous = self.threads[-1] if self.threads else None
        thread = threading.Thread(target=self._run, args=(job, previous), name='checkpoint-writer')
        thread.start()
        self.threads.append(thread)

    def _run(self, job, previous):
        if previous is not None:
            previous.join()
        if self.error is not None:
            return
        try:
            job()
        except BaseException as e:     # raised in the training thread by wait()
            self.error = e

    @property
    def failed(self):
        """Whether a job has failed, its error not yet raised by `wait`: a look that waits for nothing."""
        return self.error is not None

    def wait(self):
        """Until every submitted job is written; the first error, if one failed."""
        while self.threads:
            self.threads.pop(0).join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def wait_agreed(self, comm):
        """`wait` on every worker of `comm` (a workers.Communicator), a collective: when a worker's files failed
        (rank 0 writes them all), every worker raises, the others a RecipeError in that worker's words (the
        first failed rank's), so that all stop with one error line instead of waiting for it in their next
        collective."""
        failure = None
        try:
            self.wait()
        except Exception as e:   # noqa: BLE001   raised below, here and, in its words, on every other worker
            failure = e
        failed_ranks = comm.allreduce_sum([failure is not None and rank == comm.rank for rank in range(comm.size)])
        if not failed_ranks.any():
            return
        first = int(np.flatnonzero(failed_ranks)[0])
        said = str(failure) if isinstance(failure, RecipeError) else \
            f'worker {first} could not write its checkpoint files ({type(failure).__name__}: {failure})'
        words = comm.broadcast_text(said if comm.rank == first else '', root=first)
        if failure is not None:
            raise failure
        raise RecipeError(words)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.wait()
            return
        try:          # another error is on its way out: the pending files are still written, an error logged
            self.wait()
        except Exception as e:   # noqa: BLE001
            log.error('%s', e)


def run_or_submit(job, writer):
    """`job()` now, or by `writer` (a BackgroundWriter) in the background."""
    if writer is None:
        job()
    else:
        writer.submit(job)


def save_params(net, path, writer=None):
    """Gluon parameter file (save_parameters' names and format), written atomically, at once or by `writer` from
    host copies made now."""
    arrays = {name: param._reduce() for name, param in net._collect_params_with_prefix().items()}
    run_or_submit(functools.partial(write_arrays, path, arrays), writer)


def write_arrays(path, arrays, previous=None):
    with files.atomic_path(path, previous=previous) as tmp:
        mx.nd.save(tmp, arrays)


def nonfinite_parameters(net):
    """Names of the parameters holding NaN or infinite values (one pass over the weights: cheap per save)."""
    return [name for name, param in net._collect_params_with_prefix().items()
            if not np.isfinite(param._reduce().asnumpy()).all()]


def bytes_array(data):
    return mx.nd.array(np.frombuffer(data, dtype=np.uint8), dtype='uint8')


def checksum(arrays):
    """SHA-256 over the names and bytes of every array but 'checksum' itself, in name order; NDArrays or numpy
    arrays (the same digest), each hashed from its own buffer."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        if name != 'checksum':
            value = arrays[name]
            value = value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.ascontiguousarray(value)
            digest.update(name.encode() + str(value.dtype).encode() + str(value.shape).encode())
            digest.update(value)
    return digest.hexdigest()


def save_state(path, net, trainer, meta, previous=None, worker_statistics=None, extra=None, writer=None):
    """One file with everything an exact resume needs: parameters (by their save_parameters names), every
    worker's batchnorm statistics (`worker_statistics`: {rank: {name: array}}), the gluon.Trainer's optimizer
    state, `meta` as JSON, the `extra` named arrays (names starting with one of EXTRA_PREFIXES) and a
    checksum; written atomically, the replaced file kept as `previous`, at once or by `writer` from host copies
    made now."""
    arrays = {f'param:{name}': p._reduce() for name, p in net._collect_params_with_prefix().items()}
    for rank, statistics in (worker_statistics or {}).items():
        arrays.update({f'rank{rank}:{name}': mx.nd.array(value) for name, value in statistics.items()})
    # mx.nd.save records each array's device and mx.nd.load recreates it there: CPU arrays only, so that a
    # resume allocates nothing on the device that rank 0 saved from (the weight average lives on a GPU).
    arrays.update({name: value.copyto(mx.cpu()) for name, value in (extra or {}).items()})
    optimizer = optimizer_state.trainer_state_copy(trainer)
    payloads = {'meta': json.dumps(files.finite_or_none(meta)).encode()}
    run_or_submit(functools.partial(write_state, path, arrays, optimizer, payloads, previous), writer)


def write_state(path, arrays, optimizer, payloads, previous):
    """save_state's writing: the optimizer state's bytes, the checksum, the file."""
    payloads = dict(payloads, trainer=optimizer_state.state_bytes(*optimizer))
    # Hashed from the bytes themselves, not from copies of their NDArrays (the optimizer state is as large as the
    # weights: a copy of it was a tenth of every save).
    digest = checksum(dict(arrays, **{name: np.frombuffer(data, dtype=np.uint8) for name, data in payloads.items()}))
    arrays = dict(arrays, **{name: bytes_array(data) for name, data in payloads.items()})
    arrays['checksum'] = bytes_array(digest.encode())
    write_arrays(path, arrays, previous)


# ----------------------------------------------------------------------------------------------------------
# Reading


def read_state(path, fallback=None):
    """The State of a .state file, its checksum verified; a truncated or corrupt file is a RecipeError that
    names `fallback` (the previous state) when it exists."""
    def damaged(reason):
        keep = f'; the previous good state is {fallback}: resume from it with --load {fallback}' \
            if fallback and os.path.exists(fallback) else ''
        return RecipeError(f'{path} is damaged ({reason}){keep}')
    try:
        arrays = mx.nd.load(path)
    except mx.base.MXNetError as e:
        raise damaged(f'truncated or corrupt: {mxnet_message(e)}') from None
    if not isinstance(arrays, dict) or not {'meta', 'trainer', 'checksum'} <= set(arrays):
        raise RecipeError(f'{path} is not a .state file written by this version of the recipe')
    stored = arrays['checksum'].asnumpy().tobytes().decode()
    if stored != checksum(arrays):
        raise damaged('its checksum does not match its contents')
    params = {name[len('param:'):]: value for name, value in arrays.items() if name.startswith('param:')}
    meta = json.loads(arrays['meta'].asnumpy().tobytes().decode())
    statistics = {}
    for name, value in arrays.items():
        if name.startswith('rank'):
            rank, _, param = name[len('rank'):].partition(':')
            statistics.setdefault(int(rank), {})[param] = value.asnumpy()
    extra = {name: value for name, value in arrays.items() if name.startswith(EXTRA_PREFIXES)}
    return State(params, arrays['trainer'].asnumpy().tobytes(), meta, statistics, extra, stored)


# ----------------------------------------------------------------------------------------------------------
# Loading into a network


def load_params_into(net, params, ctx):
    """Copy {name: array} with exactly the network's names and shapes into its parameters (initialised or
    not), on the devices `ctx`, in the parameters' dtypes."""
    own = net._collect_params_with_prefix()
    for name, value in params.items():
        value = value if isinstance(value, mx.nd.NDArray) else mx.nd.array(value, dtype=value.dtype)
        own[name]._load_init(value.astype(own[name].dtype), ctx)


def network_contexts(net):
    """The devices `net` lives on (initialised, or deferred until its first batch): where loaded weights go."""
    return next(iter(net.collect_params().values())).list_ctx()


def worker_statistics(net, world):
    """{rank: {name: array}} of every worker's batchnorm running statistics (they differ between workers:
    each normalises its own batches); None with one worker. A collective: every worker must call it."""
    if world.size == 1:
        return None
    own = [(name, p) for name, p in net._collect_params_with_prefix().items() if p.grad_req == 'null']
    flat = np.concatenate([p._reduce().asnumpy().astype(np.float32).ravel() for _, p in own])
    rows = world.comm.gather(flat)
    statistics = {}
    for rank, row in enumerate(rows):
        offset, statistics[rank] = 0, {}
        for name, param in own:
            size = int(np.prod(param.shape))
            statistics[rank][name] = row[offset:offset + size].reshape(param.shape)
            offset += size
    return statistics


def restore_worker_statistics(net, world, statistics, saved_workers):
    """This worker's own batchnorm statistics from the state, so a multi-worker resume is exact."""
    if world.size == 1:
        return
    if saved_workers != world.size or world.rank not in statistics:
        log.warning('The state holds batchnorm statistics of %d workers, this run has %d: every worker starts '
                    "from rank 0's (the resume is not exact)", saved_workers, world.size)
        return
    own = net._collect_params_with_prefix()
    for name, value in statistics[world.rank].items():
        own[name].set_data(mx.nd.array(value, dtype=own[name].dtype))

