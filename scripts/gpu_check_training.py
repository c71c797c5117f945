"""The training runs of scripts/gpu_check.py: how a check runs the recipe and judges the run, and the checks of
the training features of torchvision's, timm's and MLPerf's recipes (augmentations, recipes, optimizers, the
weight average, losses, distillation, stochastic depth).

    python scripts/gpu_check.py --only auto-augment,recipes,optimizers,ema,extras,drop-path
    python scripts/gpu_check.py --device cpu --only optimizers     # the CPU twin: dali-cpu, Gloo, float32

Every run is the recipe's own (`./runner ...`) on a small set: ResNet-18 at 32x32, 128 images, seconds each.
A multi-worker run passes only when the workers said after every epoch that they hold the same weights,
batchnorm statistics and optimizer state (fit.py's replica check).
"""
import os
import re
import subprocess
import sys

import bootstrap

HERE, ROOT = os.path.dirname(os.path.abspath(__file__)), bootstrap.ROOT

SMALL = ['-b', '16', '-e', '1', '--num-layers', '18', '--image-shape', '3,32,32', '--num-classes', '10',
         '--data-val-resize', '32', '--num-examples', '128', '--seed', '1', '--disp-batches', '2']
# A recipe shrunk to the small set: its test size and warm-up made to fit one short epoch.
SHRUNK_RECIPE = ['--val-image-shape', '3,32,32', '--warmup-epochs', '0']
REPLICAS = re.compile(r'\[Epoch (\d+)\] All (\d+) workers hold the same weights')
HOST_MEMORY = re.compile(r'\[Epoch (\d+)\] Peak resident host memory of this worker: (\d+) MiB')


def run(command, timeout=900, env=None):
    """(exit status, stdout + stderr) of a command with the venv's tools on PATH."""
    env = dict(env or os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''))
    try:
        result = subprocess.run([str(c) for c in command], cwd=ROOT, capture_output=True, text=True, env=env,
                                timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f'timed out after {timeout} s'
    return result.returncode, result.stdout + result.stderr


def runner(*argv):
    return [sys.executable, os.path.join(ROOT, 'runner'), *argv]


def last_error(output):
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if 'error' in line.lower()]
    return (errors or lines or ['no output'])[-1][-300:]


def epoch_metrics(workspace):
    bootstrap.on_path()
    from rn50.reports import logs
    records = logs.read_dllogger(os.path.join(workspace, 'dllogger_log.log'))
    return [r['data'] for r in records if isinstance(r['step'], list) and len(r['step']) == 1]


def trained(workspace, status, output):
    """(passed, detail) of a training run: exit 0, finite loss, a state written."""
    if status != 0:
        return False, last_error(output)
    metrics = epoch_metrics(workspace)
    loss = metrics[-1].get('train.loss') if metrics else None
    if loss is None or loss != loss or not os.path.exists(os.path.join(workspace, 'model_last.state')):
        return False, f'no finite training loss or no state (loss {loss})'
    return True, f'train.loss {loss:.4f}, {metrics[-1].get("train.ips", 0):.1f} img/s'


def replicas_agree(output, workers, epochs):
    """(passed, detail): with several workers, the replica check said after each of `epochs` that they agree."""
    if workers < 2:
        return True, ''
    agreed = sorted({int(epoch) for epoch, count in REPLICAS.findall(output) if int(count) == workers})
    if agreed != sorted(epochs):
        return False, f'the {workers} workers did not say they hold one model after epochs {sorted(epochs)} ' \
                      f'(said after {agreed})'
    return True, f'{workers} workers hold one model after epochs {",".join(map(str, agreed))}'


def digits_dataset(workdir):
    """The demo digits as RecordIO (made once per workdir): real JPEGs for the DALI checks."""
    folder = os.path.join(workdir, 'digits')
    if not os.path.exists(os.path.join(folder, 'rec', 'val.idx')):
        for command in ([sys.executable, os.path.join(HERE, 'make_demo_dataset.py'), os.path.join(folder, 'images')],
                        [sys.executable, os.path.join(HERE, 'prepare_dataset.py'), os.path.join(folder, 'images'),
                         os.path.join(folder, 'rec'), '--names', os.path.join(folder, 'images', 'names.txt')]):
            status, output = run(command)
            if status:
                raise RuntimeError(f'could not build the digits dataset: {last_error(output)}')
    return os.path.join(folder, 'rec')


def dali_backend(options):
    return 'dali-gpu' if options.device == 'gpu' else 'dali-cpu'


def on_digits(options, workdir, name, *flags):
    """(passed, detail) of one epoch of the DALI backend on the digits with `flags`."""
    workspace = os.path.join(workdir, name)
    status, output = run(runner('-n', '1', *SMALL, '--data-backend', dali_backend(options), '--data-root',
                                digits_dataset(workdir), '--dali-threads', '2', '--workspace', workspace, *flags))
    passed, detail = trained(workspace, status, output)
    return passed, f'{name}: {detail}'


def all_of(results):
    """(passed, detail) of several (passed, detail): passed when every one did."""
    return all(passed for passed, _ in results), '; '.join(detail for _, detail in results)


def two_workers(options):
    """Workers of a multi-worker check: 2 Gloo workers on a CPU, 2 GPUs on a GPU node (None: only one GPU)."""
    if options.device == 'cpu':
        return 2
    return 2 if options.gpus >= 2 else None


# ----------------------------------------------------------------------------------------------------------
# The checks: each returns (passed, detail), or (None, reason) when it cannot run here


def check_auto_augment(options, workdir):
    """TrivialAugment-wide and AutoAugment's ImageNet policy on the DALI backend (RandAugment is dali-augment's)."""
    return all_of([on_digits(options, workdir, f'auto-augment-{policy}', '--auto-augment', policy)
                   for policy in ('ta_wide', 'imagenet')])


def check_erase(options, workdir):
    """Random erasing with per-pixel noise at the training size (no progressive resizing: a fixed canvas)."""
    return on_digits(options, workdir, 'erase-pixel', '--random-erase', '0.5', '--random-erase-mode', 'pixel')


def check_recipes(options, workdir):
    """One short epoch of --recipe torchvision-v2 and of --recipe rsb-a3 (shrunk to the small set)."""
    return all_of([on_digits(options, workdir, f'recipe-{recipe}', '--recipe', recipe, *SHRUNK_RECIPE)
                   for recipe in ('torchvision-v2', 'rsb-a3')])


def resumed_run(options, workdir, name, workers, *flags, epochs=2):
    """A run of `epochs` stopped after its first epoch and resumed: (passed, detail, output of the resumed run)."""
    workspace = os.path.join(workdir, name)
    command = runner('-n', str(workers), *SMALL, '-e', str(epochs), '--workspace', workspace, *flags)
    status, first = run(command + ['--run-epochs', '1'])
    if status:
        return False, f'{name}: {last_error(first)}', first
    status, second = run(command)
    passed, detail = trained(workspace, status, second)
    if passed and 'Resuming from' not in second:
        passed, detail = False, 'the second run did not resume'
    if passed:
        passed, agreement = replicas_agree(first + second, workers, range(epochs))
        detail += f', {agreement}' if agreement else ''
    return passed, f'{name}: {detail}', second


def check_optimizers(options, workdir):
    """--optimizer lars and lamb on 2 workers (float16 on GPUs) stopped after one epoch and resumed: the
    workers must hold one model after each epoch (LAMB's step counts restored on every device). The LAMB run
    reports the peak resident host memory of rank 0 per epoch (MXNet 1.9.1's LAMB kernel on GPUs)."""
    workers = two_workers(options)
    if workers is None:
        return None, 'needs 2 GPUs'
    results = []
    for optimizer, epochs in (('lars', 2), ('lamb', 4)):
        passed, detail, output = resumed_run(options, workdir, f'optimizer-{optimizer}', workers, '--optimizer',
                                             optimizer, '--data-backend', 'synthetic', '--num-examples', '512',
                                             epochs=epochs)
        if optimizer == 'lamb':
            memory = [f'{mib} MiB' for _, mib in HOST_MEMORY.findall(output)]
            detail += f'; peak host memory of the resumed run after epochs 1-3: {", ".join(memory) or "not logged"}' \
                      f'; MXNet\'s multi_lamb_update keeps {lamb_kernel_host_memory(options.device == "gpu"):.2f} ' \
                      'KiB of host memory per call'
        results.append((passed, detail))
    return all_of(results)


def lamb_kernel_host_memory(on_gpu, calls=1000, rounds=6):
    """KiB of host memory MXNet's multi_lamb_update (45 arrays, LAMB's call in lamb.py) keeps per call on the
    device: the growth of the resident memory over the last of `rounds` rounds of `calls` calls (the first
    rounds fill MXNet's and the allocator's pools; on a CPU the growth stops there). On GPUs MXNet 1.9.1's kernel
    keeps host memory on every call: about 4 KB per step of ResNet-50 (docs/training.md, several calls a step);
    this figure is per call of the check's 45 arrays of 256 values, for the first GPU run to measure."""
    import mxnet as mx
    import psutil
    from mxnet.ndarray.contrib import multi_lamb_update
    ctx, count = mx.gpu(0) if on_gpu else mx.cpu(), 45
    weights = [mx.nd.ones((256,), ctx=ctx) for _ in range(count)]
    grads, means, variances = ([mx.nd.full((256,), value, ctx=ctx) for _ in range(count)] for value in (0.1, 0, 0))
    process, used = psutil.Process(), []
    for _ in range(rounds):
        mx.nd.waitall()
        before = process.memory_info().rss
        for step in range(calls):
            multi_lamb_update(weights, grads, means, variances, step_count=[step + 1] * count, lrs=[1e-3] * count,
                              wds=[0.01] * count, out=weights)
        mx.nd.waitall()
        used.append((process.memory_info().rss - before) / 1024 / calls)
    return used[-1]


def check_ema(options, workdir):
    """--model-ema --model-ema-steps 2, stopped after one epoch and resumed: the average validated every epoch."""
    workers = two_workers(options) or 1
    passed, detail, _ = resumed_run(options, workdir, 'ema', workers, '--model-ema', '--model-ema-steps', '2',
                                    '--data-backend', dali_backend(options), '--data-root', digits_dataset(workdir))
    averaged = [m.get('val.ema.accuracy') for m in epoch_metrics(os.path.join(workdir, 'ema'))] if passed else []
    if passed and (len(averaged) != 2 or None in averaged):
        return False, f'the weight average was not validated after each epoch ({averaged})'
    return passed, detail + (f', val.ema.accuracy {averaged[-1]:.4f}' if passed else '')


def check_extras(options, workdir):
    """--bce-loss, --teacher (the BCE run's weights), --aug-repeats 2 and --tta flip, one run each."""
    results = [on_digits(options, workdir, 'bce', '--bce-loss')]
    teacher = os.path.join(workdir, 'bce', 'model_best.params')
    results.append(on_digits(options, workdir, 'teacher', '--teacher', teacher) if os.path.exists(teacher) else
                   (False, 'teacher: no weights from the BCE run'))
    results.append(on_digits(options, workdir, 'aug-repeats', '--aug-repeats', '2'))
    results.append(on_digits(options, workdir, 'tta', '--tta', 'flip'))
    return all_of(results)


# ResNet-50 at 224 (the runner's float16, 4-channel, NHWC, fused default on a GPU): where stochastic depth's cost
# around the fused kernel would show; 40 steps of 128 images.
RESNET50 = ['-b', '128', '-e', '1', '--num-examples', str(40 * 128), '--num-classes', '1000', '--seed', '1',
            '--disp-batches', '10']


def check_drop_path(options, workdir):
    """Images/s of the default step (synthetic data; ResNet-50 at 224 on a GPU, the small set on the CPU twin)
    with --drop-path 0.05 and without, the best of two interleaved runs each. A unit whose body may be dropped
    keeps NVIDIA's fused BatchNormAddRelu (its gamma and beta scaled for the kept samples, relu(shortcut) for
    the dropped ones): the difference is the drop's own few elementwise operators."""
    shape = SMALL if options.device == 'cpu' else RESNET50
    speeds = {'plain': 0.0, 'drop-path': 0.0}
    for attempt in range(2):     # interleaved, the best of each: a busy moment slows one run, not one setting
        for name, flags in (('plain', []), ('drop-path', ['--drop-path', '0.05'])):
            workspace = os.path.join(workdir, f'{name}-{attempt}')
            status, output = run(runner('-n', '1', *shape, '--data-backend', 'synthetic', '--workspace', workspace,
                                        *flags))
            passed, detail = trained(workspace, status, output)
            if not passed:
                return False, f'{name}: {detail}'
            speeds[name] = max(speeds[name], epoch_metrics(workspace)[-1]['train.ips'])
    ratio = speeds['drop-path'] / speeds['plain']
    return True, f'{speeds["plain"]:.1f} img/s without, {speeds["drop-path"]:.1f} with --drop-path 0.05 ' \
                 f'({ratio:.2f}x)'


def dali_copy_differences(on_gpu, rounds):
    """max |MXNet - DALI| over `rounds` batches of 16 float32 224x224 images through a DALI pipeline on the
    device, each output copied by dali.copy_output into a new MXNet array that MXNet reads at once, against
    DALI's own copy to the host. Run by gpu_check.py's dali-copy check in a process of the runner's environment."""
    bootstrap.on_path()
    import mxnet as mx
    import numpy as np
    from nvidia.dali import Pipeline, fn
    import dali
    rng = np.random.default_rng(0)
    batches = [[rng.random((3, 224, 224), dtype=np.float32) for _ in range(16)] for _ in range(rounds)]
    pipe = Pipeline(batch_size=16, num_threads=2, device_id=0 if on_gpu else None, prefetch_queue_depth=1)
    with pipe:
        pipe.set_outputs(fn.external_source(source=iter(batches), batch=True,
                                            device='gpu' if on_gpu else 'cpu') * 1.0)
    pipe.build()
    differences = []
    for _ in range(rounds):
        (output,) = pipe.run()
        tensor = output.as_tensor()
        array = mx.nd.empty(tuple(tensor.shape()), ctx=mx.gpu(0) if on_gpu else mx.cpu())
        dali.copy_output(tensor, array, on_gpu)
        read = array.asnumpy()                       # MXNet reads right after the copy
        expected = np.array((output.as_cpu() if on_gpu else output).as_tensor())
        differences.append(float(np.abs(read - expected).max()))
    return max(differences)


RUNS = {'auto-augment': check_auto_augment, 'erase': check_erase, 'recipes': check_recipes,
        'optimizers': check_optimizers, 'ema': check_ema, 'extras': check_extras, 'drop-path': check_drop_path}
