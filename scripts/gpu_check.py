#!/usr/bin/env python3
"""Acceptance pass of every GPU path: the first command to run in NVIDIA's MXNet container.

    python scripts/gpu_check.py                      # all GPUs of this machine
    python scripts/gpu_check.py --gpus 2 -o gpu_check.json
    python scripts/gpu_check.py --device cpu         # the CPU twins of the same paths (what CI runs)

It first prints the versions of MXNet, DALI, Horovod and NCCL, and each GPU's compute capability against the
ones this MXNet has kernels for, and stops there (exit 2) where a GPU can run none of them. Each check is a
short run of the recipe and a test of its outcome (ResNet-18 at 32x32 on a small set, seconds, but for
`default`); every multi-worker run must also say after each epoch that its workers hold the same weights,
batchnorm statistics and optimizer state. On GPUs:

    default        ./runner -n <every GPU> -b B shortened: ResNet-50 at 224 on ImageNet-sized JPEGs, dali-gpu,
                   float16, NHWC, 4-channel input, fused kernels; two epochs, val and pred on the GPUs, --amp; the
                   images/s as the original measured its published figures (benchmark.py --mode train -i 500 -e 3
                   -w 1), their ratio to the figure for this GPU at its batch, the same with the float16 step's
                   other order (--overflow-check before-update), the time between epochs
                   (scripts/gpu_check_default.py; minutes)

    float16        the default GPU run: float16 with float32 master weights and dynamic loss scaling,
                   NHWC convolution/batchnorm/pooling, NVIDIA's fused batchnorm kernels where MXNet has them
    amp            --amp: float32 weights, AMP float16 with its loss scaler
    dali-gpu       DALI decoding on the GPU (nvJPEG) of a real JPEG RecordIO set (the digits, made here), and the
                   first validation right after the training epoch (its pipeline built before training began)
    dali-copy      DALI GPU outputs copied into MXNet arrays (dali.copy_output) and read by MXNet at once, in the
                   runner's environment (asynchronous GPU engine, CUDA graphs): equal to DALI's own copy to the
                   host (a copy still running when MXNet reads would differ)
    dali-augment   DALI on the GPU with RandAugment, random erasing with noise, progressive resizing, a separate
                   test size and test-time flip (augment.py, resolution.py): two epochs train and validate; then
                   constant erasing of a float16 batch (DALI's GPU erase takes no float16), read alone
    kvstore-device one process driving every GPU (--kv-store device)
    horovod        one Horovod worker per GPU (NCCL)
    resume         a Horovod run stopped after its first epoch and resumed: the state holds CPU arrays only, and
                   while the resumed run trains no GPU hosts a process of another worker (nvidia-smi, polled):
                   each worker's optimizer state goes to its own GPU, not all of them to GPU 0
    export         ONNX of the float16 run's checkpoint, checked against MXNet with onnxruntime
    auto-augment   --auto-augment ta_wide and imagenet on dali-gpu
    erase          --random-erase in pixel mode at the training size (no progressive resizing)
    recipes        one short epoch of --recipe torchvision-v2 and of --recipe rsb-a3
    optimizers     --optimizer lars and lamb on 2 GPUs in float16, stopped and resumed; LAMB's run reports the
                   peak resident host memory per epoch
    ema            --model-ema --model-ema-steps 2, stopped and resumed, the average validated every epoch
    extras         --bce-loss, --teacher, --aug-repeats 2, --tta flip
    drop-path      images/s of ResNet-50 at 224 with and without --drop-path 0.05 (both on the fused kernel)
    tensorrt       a float16 TensorRT plan of export --triton's ONNX network: top-1 against MXNet's
    triton         a Triton server (TRITON_URL, TRITON_REPOSITORY) answers the repository's request as pred does

(default: scripts/gpu_check_default.py; auto-augment to drop-path: scripts/gpu_check_training.py; tensorrt and
triton: scripts/gpu_check_export.py, which skip without TensorRT or a server). With --device cpu each check runs
its CPU twin, the same recipe code on this CPU: default -> the same runs at ResNet-10, 32x32, on 2 Gloo workers of
8 images, dali-cpu, float32 (--amp skipped without AVX-512); float16 -> the recipe's float16 step on CPU-capable
operators with 2 Gloo workers and
an inf on one of them (tests/float16_twin.py); amp -> bfloat16 AMP (needs AVX-512, else reported as skipped);
dali-gpu, dali-augment and the augmentation checks -> dali-cpu; dali-copy -> the same with CPU outputs;
kvstore-device -> the step over two CPU contexts against one (pytest); horovod, resume, optimizers and ema ->
2 Gloo workers on cpu(0) and cpu(1), in float32; export -> ONNX of a checkpoint written in the GPU layout.
Prints a table (check, verdict, seconds, detail) and writes JSON with -o. Exit status 0 when every check passes
(or is skipped for a stated reason), 1 otherwise, 2 without a GPU and without --device cpu.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import bootstrap
bootstrap.start()   # the repository importable, .venv: before any third-party import
import gpu_check_default  # noqa: E402
import gpu_check_export  # noqa: E402
import gpu_check_training  # noqa: E402
from rn50.launch.supervisor import started  # noqa: E402
from gpu_check_training import (SMALL, digits_dataset, epoch_metrics, last_error, replicas_agree, run,  # noqa: E402
                                runner, trained)

HERE, ROOT = os.path.dirname(os.path.abspath(__file__)), bootstrap.ROOT

CHECKS = ('default', 'float16', 'amp', 'dali-gpu', 'dali-copy', 'dali-augment', 'kvstore-device', 'horovod', 'resume',
          'export', 'auto-augment', 'erase', 'recipes', 'optimizers', 'ema', 'extras', 'drop-path', 'tensorrt',
          'triton')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='gpu', choices=['gpu', 'cpu'],
                        help='gpu: check the GPU paths; cpu: run their CPU twins')
    parser.add_argument('--gpus', type=int, default=None, help='GPUs to use (default: all)')
    parser.add_argument('--only', default=','.join(CHECKS), help='comma-separated checks to run')
    parser.add_argument('--workdir', default=None,
                        help='where runs and data go, kept (default: a temporary folder, removed at the end)')
    parser.add_argument('-o', '--output', default=None, help='write the results as JSON here')
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------
# The checks: each returns (passed, detail), or (None, reason) when it cannot run here


def check_float16(options, workdir):
    if options.device == 'cpu':
        output_file = os.path.join(workdir, 'float16_twin.json')
        status, output = run(started(['horovodrun', '-np', '2', '--gloo', sys.executable,
                                      os.path.join(ROOT, 'tests', 'float16_twin.py'), output_file]))
        if status:
            return False, last_error(output)
        with open(output_file) as f:
            ranks = json.load(f)
        same = ranks[0]['weight'] == ranks[1]['weight'] and all(r['skipped'] == 1 for r in ranks)
        return same, f'2 workers, inf on rank 1: skipped {[r["skipped"] for r in ranks]}, scale ' \
                     f'{[r["scale"] for r in ranks]}, weights {"equal" if same else "DIFFER"}'
    workspace = os.path.join(workdir, 'float16')
    status, output = run(runner('-n', '1', *SMALL, '--image-shape', '4,32,32', '--data-backend', 'synthetic',
                                '--workspace', workspace))
    passed, detail = trained(workspace, status, output)
    fused = '--fuse-bn-relu 1' in output
    return passed, f'{detail}; NHWC layers, fused batchnorm kernels {"on" if fused else "off (not in this MXNet)"}'


def check_amp(options, workdir):
    workspace = os.path.join(workdir, 'amp')
    status, output = run(runner('-n', '1', *SMALL, '--data-backend', 'synthetic', '--amp', '--dtype', 'float32',
                                '--workspace', workspace))
    if options.device == 'cpu' and status == 2 and 'needs an AVX-512 CPU' in output:
        return None, 'bfloat16 needs AVX-512: skipped on this CPU'
    return trained(workspace, status, output)


def check_dali(options, workdir):
    backend = 'dali-gpu' if options.device == 'gpu' else 'dali-cpu'
    workspace = os.path.join(workdir, backend)
    status, output = run(runner('-n', '1', *SMALL, '--data-backend', backend, '--data-root',
                                digits_dataset(workdir), '--workspace', workspace, '--dali-threads', '2'))
    passed, detail = trained(workspace, status, output)
    accuracy = (epoch_metrics(workspace) or [{}])[-1].get('val.accuracy') if passed else None
    if passed and accuracy is None:
        return False, f'{backend}: no validation after the training epoch'
    return passed, f'{backend}: {detail}' + (f', validated after it: top-1 {accuracy:.4f}' if passed else '')


def check_dali_augment(options, workdir):
    backend = 'dali-gpu' if options.device == 'gpu' else 'dali-cpu'
    workspace = os.path.join(workdir, 'dali-augment')
    status, output = run(runner('-n', '1', *SMALL, '-e', '2', '--data-backend', backend, '--data-root',
                                digits_dataset(workdir), '--workspace', workspace, '--dali-threads', '2',
                                '--auto-augment', 'ra', '--random-erase', '0.5', '--random-erase-mode', 'pixel',
                                '--progressive-size', '24', '--progressive-epochs', '0,1', '--progressive-step', '8',
                                '--val-image-shape', '3,40,40', '--data-val-resize', '46', '--tta', 'flip',
                                '--warmup-epochs', '0'))
    passed, detail = trained(workspace, status, output)
    validated = [m.get('val.accuracy') for m in epoch_metrics(workspace)] if passed else []
    if passed and (len(validated) != 2 or None in validated or 'training at 24x24' not in output):
        return False, f'{backend}: expected 2 validated epochs, the first trained at 24x24 ({validated})'
    if not passed:
        return False, f'{backend}: {detail}'
    # Constant erasing (torchvision-v2's) of a float16 batch: DALI's GPU erase takes no float16, so the loader
    # erases in float32 and casts after (issue 36); the epoch is read alone (--test-io). The twin reads float32
    # (the runner refuses float16 on a CPU); its float16 graph is tested in tests/test_augment.py.
    dtype = 'float16' if options.device == 'gpu' else 'float32'
    workspace = os.path.join(workdir, 'dali-erase-' + dtype)
    status, output = run(runner('-n', '1', *SMALL, '--data-backend', backend, '--data-root', digits_dataset(workdir),
                                '--workspace', workspace, '--dali-threads', '2', '--dtype', dtype,
                                '--random-erase', '0.5', '--random-erase-mode', 'const', '--test-io'))
    read = [m.get('train.ips') for m in epoch_metrics(workspace)] if status == 0 else []
    if not read or None in read:
        return False, f'{backend}: constant erasing in {dtype}: {last_error(output)}'
    return True, f'{backend}: {detail}, top-1 {validated[-1]:.4f} at 40x40 with flip; constant erasing in {dtype} ' \
                 f'read at {read[-1]:.1f} img/s'


def check_dali_copy(options, workdir, rounds=8):
    """gpu_check_training.dali_copy_differences in a process of the runner's environment for this machine, with
    MXNet's asynchronous GPU engine and CUDA graphs on, as every GPU run has them."""
    status, plan = run(runner('-n', '1', '--dry-run'))
    if status:
        return False, last_error(plan)
    env = dict(os.environ, **dict(line.split('=', 1) for line in plan.splitlines()
                                  if re.match(r'^[A-Z][A-Z0-9_]*=', line)))
    env.update(MXNET_ASYNC_GPU_ENGINE='1', MXNET_ENABLE_CUDA_GRAPHS='1')
    on_gpu = options.device == 'gpu'
    status, output = run([sys.executable, '-c', f'import sys; sys.path.insert(0, {HERE!r}); import gpu_check_training; '
                          f'print(gpu_check_training.dali_copy_differences({on_gpu}, {rounds}))'], env=env)
    if status:
        return False, last_error(output)
    difference = float(output.strip().splitlines()[-1])
    return difference == 0, f'{rounds} batches of 16x3x224x224 float32 copied {"GPU" if on_gpu else "CPU"} ' \
                            f'outputs: max |MXNet - DALI| {difference} (MXNET_ASYNC_GPU_ENGINE=1, CUDA graphs on)'


def check_kvstore_device(options, workdir):
    if options.device == 'cpu':
        status, output = run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                              os.path.join(ROOT, 'tests', 'test_fit.py'), '-k', 'two_devices'])
        return status == 0, 'two CPU contexts follow one (tests/test_fit.py)' if status == 0 else last_error(output)
    workspace = os.path.join(workdir, 'kvstore-device')
    status, output = run(runner('-n', str(options.gpus), '--kv-store', 'device', *SMALL, '--data-backend',
                                'synthetic', '--workspace', workspace))
    return trained(workspace, status, output)


def check_horovod(options, workdir):
    workers = 2 if options.device == 'cpu' else options.gpus
    workspace = os.path.join(workdir, 'horovod')
    status, output = run(runner('-n', str(workers), *SMALL, '--data-backend', 'synthetic', '--workspace', workspace))
    passed, detail = trained(workspace, status, output)
    if passed:
        passed, agreement = replicas_agree(output, workers, [0])
        detail += f', {agreement}'
    return passed, f'{workers} workers ({"Gloo" if options.device == "cpu" else "NCCL"}): {detail}'


def check_resume(options, workdir):
    workers = 2 if options.device == 'cpu' else options.gpus
    if workers < 2:
        return None, 'needs 2 GPUs'
    workspace = os.path.join(workdir, 'resume')
    command = runner('-n', str(workers), *SMALL, '-e', '2', '--data-backend', 'synthetic', '--workspace', workspace)
    status, output = run(command + ['--run-epochs', '1'])
    if status:
        return False, last_error(output)
    devices = state_devices(os.path.join(workspace, 'model_last.state'))
    if devices != {'cpu(0)'}:
        return False, f'the state holds arrays on {", ".join(sorted(devices))}, not on the CPU only'
    watch = GpuProcesses() if options.device == 'gpu' else None
    try:
        status, output = run(command)
    finally:
        crowded = watch.stop() if watch else {}
    passed, detail = trained(workspace, status, output)
    if passed and 'Resuming from' not in output:
        return False, 'the second run did not resume'
    if passed:
        passed, agreement = replicas_agree(output, workers, [1])
        detail += f', {agreement}'
    if crowded:
        return False, 'while resuming, GPUs hosted processes of several workers: ' + \
            ', '.join(f'{gpu}: {count}' for gpu, count in sorted(crowded.items()))
    return passed, f'{workers} workers resumed from a CPU-only state: {detail}'


def state_devices(path):
    """The devices of every array of a .state file, the optimizer state's included (as text, e.g. 'cpu(0)')."""
    import pickle
    import mxnet as mx
    from rn50.checkpoints import checkpoint
    state = checkpoint.read_state(path)
    found = {str(array.context) for array in mx.nd.load(path).values()}
    pending = [pickle.loads(state.trainer)[0]]
    while pending:
        value = pending.pop()
        if isinstance(value, mx.nd.NDArray):
            found.add(str(value.context))
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (tuple, list)):
            pending.extend(value)
    return found


class GpuProcesses:
    """Polls nvidia-smi every half second: the most compute processes seen on each GPU at once."""

    def __init__(self):
        import threading
        self.most, self.done = {}, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self):
        while not self.done.wait(0.5):
            status, output = run(['nvidia-smi', '--query-compute-apps=gpu_bus_id,pid', '--format=csv,noheader'], 30)
            if status:
                continue
            counts = {}
            for line in output.splitlines():
                if ',' in line:
                    counts[line.split(',')[0].strip()] = counts.get(line.split(',')[0].strip(), 0) + 1
            for gpu, count in counts.items():
                self.most[gpu] = max(self.most.get(gpu, 0), count)

    def stop(self):
        """{GPU bus id: processes} for every GPU that hosted more than one process at once."""
        self.done.set()
        self.thread.join()
        return {gpu: count for gpu, count in self.most.items() if count > 1}


def check_export(options, workdir):
    source = os.path.join(workdir, 'float16', 'model_last.state')
    if options.device == 'cpu':
        source = os.path.join(workdir, 'gpu_layout.params')
        gpu_layout_checkpoint(source)
    if not os.path.exists(source):
        return None, 'needs the float16 check first'
    workspace = os.path.join(workdir, 'export')
    status, output = run(runner('-n', '1', '--mode', 'export', '--load', source, *SMALL, '--image-shape', '4,32,32',
                                '--data-backend', 'synthetic', '--workspace', workspace))
    if status:
        return False, last_error(output)
    with open(os.path.join(workspace, 'report_export.json')) as f:
        difference = json.load(f)['summary'].get('onnxruntime_max_difference')
    passed = difference is not None and difference < 1e-3
    return passed, f'ONNX float32 NCHW, onnxruntime vs MXNet max |difference| {difference}'


def gpu_layout_checkpoint(path):
    """A checkpoint as a float16 GPU run writes it (OHWI weights, 4-channel stem), by shape inference alone."""
    import mxnet as mx
    import models
    net = models.get_model(num_layers=18, num_classes=10, image_shape=(4, 32, 32), dtype='float16', device='gpu',
                           conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC')
    net.initialize(mx.init.Xavier())
    net.save_parameters(path)


RUNS = {'float16': check_float16, 'amp': check_amp, 'dali-gpu': check_dali, 'dali-copy': check_dali_copy,
        'dali-augment': check_dali_augment,
        'kvstore-device': check_kvstore_device, 'horovod': check_horovod, 'resume': check_resume,
        'export': check_export, **gpu_check_training.RUNS, **gpu_check_default.RUNS, **gpu_check_export.RUNS}


def library_versions():
    """MXNet, DALI, Horovod and the NCCL Horovod was built with: what a GPU result depends on. DALI is imported
    before Horovod (the other order crashes DALI's pipelines: rn50/world/workers.py)."""
    import mxnet as mx
    versions = {'MXNet': mx.__version__}
    for name, module in (('DALI', 'nvidia.dali'), ('Horovod', 'horovod')):
        try:
            versions[name] = __import__(module, fromlist=['__version__']).__version__
        except ImportError:
            versions[name] = 'not installed'
    try:
        import horovod.mxnet as hvd
        code = int(hvd.nccl_built() or 0)
    except ImportError:
        code = 0
    # NCCL_VERSION_CODE: major * 1000 + minor * 100 + patch before NCCL 2.9, major * 10000 + minor * 100 + patch since
    major, rest = divmod(code, 10000 if code >= 10000 else 1000)
    versions['NCCL'] = f'{major}.{rest // 100}.{rest % 100}' if code else 'not built (Gloo only)'
    return versions


def verdict(passed):
    return {True: 'PASS', False: 'FAIL', None: 'SKIP'}[passed]


def main(argv=None):
    options = parse_args(argv)
    wanted = [name for name in options.only.split(',') if name]
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown:
        print(f'error: unknown checks {", ".join(unknown)}: choose from {", ".join(CHECKS)}', file=sys.stderr)
        return 2
    import mxnet as mx
    gpus = mx.context.num_gpus()
    if options.device == 'gpu' and gpus == 0:
        print('error: no GPU found: this script checks the GPU paths; run it with --device cpu for their CPU '
              'twins', file=sys.stderr)
        return 2
    options.gpus = options.gpus or gpus
    versions = library_versions()
    print('versions: ' + ', '.join(f'{name} {version}' for name, version in versions.items()), flush=True)
    if options.device == 'gpu':
        line, runnable = gpu_check_default.device_line()
        print(line, flush=True)
        if not runnable:   # every check would fail on its first kernel
            print('error: this MXNet has no kernel these GPUs can run (above): see docs/gpu-paths.md#mxnet-and-gpus',
                  file=sys.stderr)
            return 2
    workdir = options.workdir or tempfile.mkdtemp(prefix='gpu_check.')
    os.makedirs(workdir, exist_ok=True)
    try:
        results = run_checks(options, wanted, workdir)
    finally:
        if not options.workdir:   # its runs and datasets (about 500 MB) are of no use once reported
            shutil.rmtree(workdir, ignore_errors=True)
    report = {'device': options.device, 'gpus': options.gpus if options.device == 'gpu' else 0,
              'workdir': options.workdir, 'versions': versions, 'results': results}
    print(json.dumps(report))
    if options.output:
        with open(options.output, 'w') as f:
            json.dump(report, f, indent=2)
    return 0 if all(r['verdict'] != 'FAIL' for r in results) else 1


def run_checks(options, wanted, workdir):
    """Run the wanted checks in CHECKS order, printing a line each; a check that breaks is a failed check."""
    results = []
    for name in CHECKS:
        if name not in wanted:
            continue
        start = time.time()
        try:
            passed, detail = RUNS[name](options, workdir)
        except Exception as e:     # a check that breaks is a failed check, and the others still run
            passed, detail = False, f'{type(e).__name__}: {e}'
        results.append({'check': name, 'verdict': verdict(passed), 'seconds': round(time.time() - start, 1),
                        'detail': detail})
        print(f'{name:15s} {results[-1]["verdict"]:5s} {results[-1]["seconds"]:7.1f} s  {detail}', flush=True)
    return results


if __name__ == '__main__':
    sys.exit(main())
