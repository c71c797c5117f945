"""memory.py: a batch that cannot fit is refused before anything is allocated, with what it needs and what the
machine has; the estimate follows the batch and the image area; the GPU path (free memory per GPU from MXNet)
run on CPU contexts."""
import os
import re
import resource
import subprocess
import sys
import types

import mxnet as mx
import pytest

from rn50.config import resolve
from rn50.data import contract
from rn50.world import devices, memory, workers
import models
from conftest import ROOT, resolved
from rn50.errors import RecipeError
from rn50.nets.network import Network

GB = 1024 ** 3


def limit_address_space():
    """Without the check a huge batch is allocated until the kernel kills something: keep the test's own
    process to 8 GB of address space so that it fails alone, with an allocation error."""
    resource.setrlimit(resource.RLIMIT_AS, (8 * GB, 8 * GB))


@pytest.mark.integration
def test_a_batch_that_cannot_fit_is_one_error_line_with_both_figures(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'train.py'), '--data-backend', 'synthetic', '--num-layers', '10',
         '--image-shape', '3,64,64', '--num-classes', '10', '--batch-size', '1000000', '--workspace', str(tmp_path)],
        capture_output=True, text=True, timeout=120, preexec_fn=limit_address_space)
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    match = re.fullmatch(r'error: --batch-size 1000000 \(1000000 images per device, 3x64x64 float32, training\) '
                         r'needs about ([0-9.]+) GB of memory, and this machine has ([0-9.]+) GB available: lower '
                         r'the batch size \(about ([0-9]+) images per device would fit\)', line)
    assert match, line
    need, available, fitting = float(match.group(1)), float(match.group(2)), int(match.group(3))
    assert need > 1000 and 0 < available < need and 0 < fitting < 1000000
    assert not os.path.exists(tmp_path / 'model_last.state')


def need_of(args, net, images):
    """memory.batch_need of the resolved flags `args` for a batch of `images` images, as train.py asks."""
    return memory.batch_need(net, images, contract.Images.of(args), args.dtype, args.mode in ('train', 'train_val'))


def fits(args, net, world):
    """memory.check_batch_fits of the resolved flags `args`, as train.py calls it."""
    memory.check_batch_fits(net, world, args.batch_size, contract.Images.of(args), args.dtype, args.mode, args.test_io)


def small_run(flags=()):
    args = resolved(['--num-layers', '50', '--num-classes', '10', '--image-shape', '3,32,32', '--mode', 'train']
                    + list(flags))
    return args, models.build(Network.of(args))


@pytest.mark.unit
def test_the_estimate_grows_with_the_batch_and_the_image_area():
    args, net = small_run()
    need_8, per_image = need_of(args, net, 8)
    need_64, _ = need_of(args, net, 64)
    assert need_64 - need_8 == pytest.approx(56 * per_image)
    # The fixed part: ResNet-50's 23.5 M parameters (10 classes), weights + gradients + momentum in float32; in
    # float16 also the float32 master weights and the undoable update's copies (22 bytes a parameter).
    assert need_8 - 8 * per_image == pytest.approx(23.6e6 * 4 * 3, rel=0.02)
    half = resolve.with_values(args, dtype='float16')
    need_half, per_half = need_of(half, net, 8)
    assert need_half - 8 * per_half == pytest.approx(23.6e6 * 22, rel=0.02) and per_half == pytest.approx(per_image / 2)
    # The calibration runs (memory.py): 1.86 MB per image measured at 3x32x32, 7.98 MB at 3x64x64.
    assert per_image == pytest.approx(1.86 * 2 ** 20, rel=0.1)
    big, big_net = small_run(['--image-shape', '3,64,64'])
    assert need_of(big, big_net, 1)[1] == pytest.approx(7.98 * 2 ** 20, rel=0.15)
    val, val_net = small_run(['--mode', 'val'])
    assert need_of(val, val_net, 1)[1] < per_image / 5   # no activations kept for a backward pass


@pytest.mark.unit
def test_a_batch_that_fits_passes_and_pred_is_not_checked(monkeypatch):
    args, net = small_run(['--batch-size', '64'])
    world = workers.World()
    fits(args, net, world)
    monkeypatch.setattr(memory, 'host_available', lambda: 10 ** 6)
    with pytest.raises(RecipeError, match='needs about 0.4 GB of memory, and this machine has 0.0 GB available'):
        fits(args, net, world)
    fits(resolve.with_values(args, mode='pred'), net, world)


@pytest.mark.unit
def test_several_workers_of_a_node_share_its_memory(monkeypatch):
    args, net = small_run(['--batch-size', '64'])
    need, _ = need_of(args, net, 32)
    monkeypatch.setattr(memory, 'host_available', lambda: 1.5 * need)
    alone = workers.World(workers.Communicator(size=2, local_size=1))
    fits(args, net, alone)           # one worker of two on this node: 32 images fit
    together = workers.World(workers.Communicator(size=2, local_size=2))
    with pytest.raises(RecipeError, match=r'of memory x 2 workers on this node'):
        fits(args, net, together)


@pytest.mark.unit
def test_gpu_path_on_cpu_contexts(monkeypatch):
    """Two CPU contexts stand for two GPUs: each device's batch against its own free memory."""
    args, net = small_run(['--batch-size', '64'])
    world = workers.World(devices=devices.Devices((mx.cpu(0), mx.cpu(1)), 'gpu'))
    need, _ = need_of(args, net, 32)       # 64 images over 2 devices
    free = {0: 2 * need, 1: need / 2}
    monkeypatch.setattr(mx.context, 'gpu_memory_info', lambda device_id: (free[device_id], 16 * GB))
    with pytest.raises(RecipeError, match=r'\(32 images per device, .*\) needs about [0-9.]+ GB on GPU 1, which '
                                          r'has [0-9.]+ GB free: lower the batch size'):
        fits(args, net, world)
    free[1] = 2 * need
    fits(args, net, world)

    def unknown(device_id):
        raise mx.base.MXNetError('no such call in this build')
    monkeypatch.setattr(mx.context, 'gpu_memory_info', unknown)
    fits(args, net, world)   # MXNet cannot tell: no check


@pytest.mark.unit
def test_a_batch_far_larger_than_the_set_is_said(caplog):
    import types
    loader = types.SimpleNamespace(batch_size=192, num_examples=32)
    world = workers.World()
    with caplog.at_level('WARNING', logger='rn50.world.memory'):
        memory.check_batch_against_data(loader, world)
    assert 'The global batch (192) is far larger than the 32 validation images: 83% of it is padding' in caplog.text
    caplog.clear()
    memory.check_batch_against_data(types.SimpleNamespace(batch_size=16, num_examples=32), world)
    assert not caplog.text
