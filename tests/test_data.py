"""data.py and dali.py: the loader contract on both real backends and the synthetic one."""
import gc
import io
import os
import weakref

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

import data
from rn50.data import synthetic
import train
from train import get_loaders
from conftest import digits_flags, resolved
from rn50.errors import RecipeError
from rn50.config import resolve
from rn50.data import contract
from rn50.data import preset
from rn50.data import validation_resize

pytestmark = pytest.mark.unit

REAL = ['mxnet', 'dali-cpu']


def write_rec(folder, labels, corrupt=(), size=(48, 40)):
    """A .rec/.idx whose record i has label labels[i] and a distinctive image; `corrupt` indices get
    truncated JPEG bytes."""
    os.makedirs(folder, exist_ok=True)
    writer = mx.recordio.MXIndexedRecordIO(os.path.join(folder, 'd.idx'), os.path.join(folder, 'd.rec'), 'w')
    for i, label in enumerate(labels):
        pixels = np.random.default_rng(i).integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format='JPEG')
        payload = buffer.getvalue()
        if i in corrupt:
            payload = payload[:len(payload) // 4]
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), i, 0), payload))
    writer.close()
    return os.path.join(folder, 'd.rec'), os.path.join(folder, 'd.idx')


def unique_label_args(tmp_path, backend, count=30, batch=6, extra=()):
    """Records whose labels are their own index, so label streams show which records were read."""
    rec, idx = write_rec(str(tmp_path / 'u'), list(range(count)))
    return resolved(['--data-train', rec, '--data-train-idx', idx, '--data-val', rec, '--data-val-idx', idx,
                     '--num-classes', str(count), '--image-shape', '3,32,32', '--data-val-resize', '32',
                     '--batch-size', str(batch), '--data-backend', backend, '--seed', '5',
                     '--data-mxnet-threads', '1', '--dali-threads', '1', '--dali-validation-threads', '1',
                     '--dali-prefetch-queue', '2'] + list(extra))


def real_labels(loader, epoch=0):
    """Labels of the real (non-filler) samples of one epoch, consumed batch by batch."""
    seen = []
    for batch in loader.epoch(epoch):
        labels = batch.label[0].asnumpy()
        seen += labels[:len(labels) - batch.pad].astype(int).tolist()
    return seen


@pytest.mark.parametrize('backend', REAL)
@pytest.mark.parametrize('workers', [2, 3])
def test_sharding_covers_every_record_once(tmp_path, backend, workers):
    args = unique_label_args(tmp_path, backend, count=29, batch=6)
    train_seen, val_seen, steps = [], [], set()
    for rank in range(workers):
        train, val = get_loaders(args, rank, workers)
        steps.add(train.num_batches)
        train_seen += real_labels(train)
        val_seen += real_labels(val)
    assert len(steps) == 1                      # every worker makes the same number of steps
    assert sorted(train_seen) == list(range(29))
    assert sorted(val_seen) == list(range(29))


@pytest.mark.parametrize('backend', REAL)
def test_a_loader_let_go_in_the_middle_of_an_epoch_is_freed_at_once(tmp_path, backend):
    """A loader dropped mid-epoch (--test-io's --benchmark-iters, a stop request, a train.main run in process) is
    freed then, with DALI's pipelines shut down, their threads and buffers, not by Python's cyclic collector at an
    arbitrary later moment (a pipeline held its feed, which held the loader, which held the pipeline)."""
    args = unique_label_args(tmp_path, backend, count=29, batch=6)
    gc.disable()            # only reference counting frees them
    try:
        train, val = get_loaders(args, 0, 1)
        epochs = [loader.epoch(0) for loader in (train, val)]
        assert [next(epoch).data[0].shape[0] for epoch in epochs] == [6, 6]
        alive = [weakref.ref(train), weakref.ref(val)] + [weakref.ref(pipe) for pipe in getattr(train, 'pipes', [])]
        del train, val, epochs
        assert [ref() for ref in alive] == [None] * len(alive)
    finally:
        gc.enable()


@pytest.mark.parametrize('backend', REAL)
def test_validation_pad_and_order(tmp_path, backend):
    args = unique_label_args(tmp_path, backend, count=29, batch=6)
    _, val = get_loaders(args, 0, 1, train=False)
    pads = [b.pad for b in val.epoch(0)]
    assert val.num_batches == 5 and pads == [0, 0, 0, 0, 1]
    assert real_labels(val) == list(range(29))   # file order, each once


@pytest.mark.parametrize('backend', REAL)
def test_epochs_are_deterministic_resumable_and_distinct(tmp_path, backend):
    args = unique_label_args(tmp_path, backend, count=24, batch=6)
    train, _ = get_loaders(args, 0, 1, val=False)
    full = [(b.data[0].asnumpy().copy(), b.label[0].asnumpy().copy()) for b in train.epoch(3)]
    tail = [(b.data[0].asnumpy().copy(), b.label[0].asnumpy().copy()) for b in train.epoch(3, 2)]
    assert len(tail) == len(full) - 2
    for (x, y), (tx, ty) in zip(full[2:], tail):
        np.testing.assert_array_equal(x, tx)
        np.testing.assert_array_equal(y, ty)
    other = [b.label[0].asnumpy().copy() for b in train.epoch(4)]
    assert not all(np.array_equal(a[1], b) for a, b in zip(full, other))


def test_backends_agree_on_labels_and_statistics(digits):
    stats = {}
    for backend in REAL:
        for layout in ('NCHW', 'NHWC'):
            args = resolved(digits_flags(digits, batch=32) + ['--data-backend', backend, '--input-layout', layout])
            train, val = get_loaders(args, 0, 1)
            batch = next(train.epoch(0))
            images = batch.data[0].asnumpy()
            assert images.dtype == np.float32
            assert images.shape == ((32, 3, 32, 32) if layout == 'NCHW' else (32, 32, 32, 3))
            val_images, val_labels = [], []
            for b in val.epoch(0):
                real = b.data[0].shape[0] - b.pad
                val_images.append(b.data[0].asnumpy()[:real].copy())
                val_labels.append(b.label[0].asnumpy()[:real].copy())
            stats[backend, layout] = (np.concatenate(val_labels), np.concatenate(val_images))
    for layout in ('NCHW', 'NHWC'):
        labels_mx, images_mx = stats['mxnet', layout]
        labels_dali, images_dali = stats['dali-cpu', layout]
        np.testing.assert_array_equal(labels_mx, labels_dali)
        axes = (0, 2, 3) if layout == 'NCHW' else (0, 1, 2)
        np.testing.assert_allclose(images_mx.mean(axis=axes), images_dali.mean(axis=axes), atol=0.05)
        np.testing.assert_allclose(images_mx.std(axis=axes), images_dali.std(axis=axes), rtol=0.05)


def test_four_channels(digits):
    args = resolved(digits_flags(digits, batch=8) + ['--data-backend', 'dali-cpu', '--image-shape', '4,32,32'])
    images = next(get_loaders(args, 0, 1, val=False)[0].epoch(0)).data[0].asnumpy()
    assert images.shape == (8, 4, 32, 32) and (images[:, 3] == 0).all() and images[:, :3].std() > 0.1


def test_num_examples_defaults_to_records_and_limits_epoch(digits):
    args = resolved(digits_flags(digits, batch=16) + ['--data-backend', 'mxnet'])
    train, val = get_loaders(args, 0, 1)
    assert train.num_examples == 1438 and train.num_batches == 90 and val.num_examples == 359
    args = resolved(digits_flags(digits, batch=16) + ['--data-backend', 'mxnet', '--num-examples', '160'])
    train, _ = get_loaders(args, 0, 1, val=False)
    assert train.num_batches == 10 and len(list(train.epoch(0))) == 10


def training_loader(rec, idx, backend, batch=4, side=32, classes=3):
    """One worker's training loader of `backend` over a small .rec, one decoding thread."""
    args = resolved(['--data-train', rec, '--data-train-idx', idx, '--num-classes', str(classes), '--batch-size',
                     str(batch), '--image-shape', f'3,{side},{side}', '--data-backend', backend,
                     '--data-mxnet-threads', '1', '--dali-threads', '1'])
    return get_loaders(args, 0, 1, val=False)[0]


@pytest.mark.parametrize('backend', REAL)
def test_corrupt_record(tmp_path, backend):
    rec, idx = write_rec(str(tmp_path / 'c'), [i % 3 for i in range(12)], corrupt={5})
    train = training_loader(rec, idx, backend)
    # Neither decoder can skip a bad image: the error names the record and the fix
    with pytest.raises(RecipeError, match=f'record 5 of {rec} cannot be decoded.*prepare_dataset.py'):
        list(train.epoch(0))


def test_label_out_of_range_and_bad_index(tmp_path):
    rec, idx = write_rec(str(tmp_path / 'l'), [0, 1, 7, 2])
    flags = ['--data-train', rec, '--data-train-idx', idx, '--num-classes', '5', '--batch-size', '2',
             '--data-backend', 'mxnet']
    with pytest.raises(RecipeError, match='record 2 .* has label 7, outside \\[0, 5\\)'):
        get_loaders(resolved(flags), 0, 1)
    with open(idx, 'a') as f:
        f.write('9\t3\n')                                  # an offset that is not a record header
    with pytest.raises(RecipeError, match='does not match'):
        get_loaders(resolved(flags[:-2] + ['--num-classes', '8', '--data-backend', 'dali-cpu']), 0, 1)
    os.remove(idx)
    with pytest.raises(RecipeError, match='index .* not found'):
        get_loaders(resolved(flags[:-2] + ['--num-classes', '8', '--data-backend', 'mxnet']), 0, 1)
    with pytest.raises(RecipeError, match='not found'):
        get_loaders(resolved(['--data-train', str(tmp_path / 'missing.rec'), '--data-backend', 'mxnet']), 0, 1)


def test_default_backend_falls_back_and_explicit_gpu_is_refused(caplog):
    if mx.context.num_gpus():
        pytest.skip('this machine has a GPU')
    with caplog.at_level('INFO'):
        args = resolved(['--data-train', 'train.rec'])
    assert args.data_backend == 'dali-cpu' and 'defaults to dali-cpu' in caplog.text
    with pytest.raises(RecipeError, match='needs a GPU'):
        data.check_backend(resolved(['--data-backend', 'dali-gpu', '--data-train', 'train.rec']), frozenset(),
                           on_gpu=False)


def test_synthetic_shapes_and_global_batch_slices():
    args = resolved(['--data-backend', 'synthetic', '--batch-size', '8', '--image-shape', '3,16,16',
                     '--num-classes', '10', '--num-examples', '64', '--seed', '2'])
    whole, val = get_loaders(args, 0, 1)
    batch = next(whole.epoch(0))
    assert batch.data[0].shape == (8, 3, 16, 16) and batch.data[0].dtype == np.float32
    assert whole.num_batches == 8 and val.num_examples == 2      # 64 x 50,000 / 1,281,167
    halves = [next(get_loaders(args, r, 2, val=False)[0].epoch(0)) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([h.data[0].asnumpy() for h in halves]), batch.data[0].asnumpy())
    np.testing.assert_array_equal(np.concatenate([h.label[0].asnumpy() for h in halves]),
                                  batch.label[0].asnumpy())


def test_load_image_uses_validation_preprocessing(tmp_path):
    path = str(tmp_path / 'wide.png')
    Image.fromarray(np.full((40, 80, 3), 255, np.uint8)).save(path)
    args = resolved(['--image-shape', '4,32,32', '--data-val-resize', '36', '--input-layout', 'NHWC'])
    image = validation_resize.load_image(path, contract.Images.of(args)).asnumpy()
    assert image.shape == (1, 32, 32, 4)
    np.testing.assert_allclose(image[0, 0, 0, :3], (255 - np.array(args.rgb_mean)) / np.array(args.rgb_std),
                               rtol=1e-5)
    assert (image[..., 3] == 0).all()
    (tmp_path / 'bad.jpg').write_bytes(b'no')
    with pytest.raises(RecipeError, match='cannot read image') as error:
        validation_resize.load_image(str(tmp_path / 'bad.jpg'), contract.Images.of(args))
    assert 'Traceback' not in str(error.value) and len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize('flags, backend, message', [
    (['--max-random-h', '20'], 'dali-cpu', 'only --data-backend mxnet'),
    (['--pca-noise', '0.1'], 'synthetic', 'only --data-backend mxnet'),
    (['--random-resized-crop', '0'], 'dali-cpu', 'only --data-backend mxnet'),
    (['--max-random-scale', '1.2'], 'mxnet', 'add --random-resized-crop 0'),
    (['--min-random-area', '0.9', '--max-random-area', '0.5'], 'mxnet', 'expected 0 < min <= max <= 1'),
    (['--min-random-aspect-ratio', '2', '--max-random-aspect-ratio', '1'], 'dali-cpu', 'aspect ratio range'),
    (['--data-val-resize', '16'], 'mxnet', 'center crop would not fit'),
    (['--rgb-std', '1,0,1'], 'mxnet', '--rgb-std'),
    (['--auto-augment', 'ta_wide'], 'mxnet', 'only the DALI backends implement this'),
    (['--random-erase', '0.25'], 'synthetic', 'only the DALI backends implement this'),
    (['--auto-augment', 'ra', '--ra-magnitude', '31'], 'dali-cpu', 'above --ra-magnitude-scale 30'),
    (['--auto-augment', 'ta_wide', '--ra-prob', '0.5'], 'dali-cpu', '--ra-prob would be ignored'),
    (['--ra-magnitude', '5', '--ra-ops', 'timm-increasing'], 'dali-cpu', '--ra-magnitude, --ra-ops would be'),
    (['--auto-augment-fill', 'mean'], 'dali-cpu', '--auto-augment-fill would be ignored'),
    (['--aug-repeats', '3'], 'synthetic', 'synthetic has none'),
    (['--progressive-size', '16'], 'synthetic', 'synthetic has none'),
    (['--progressive-size', '48'], 'dali-cpu', 'larger than --image-shape'),
    (['--progressive-epochs', '1,3'], 'mxnet', 'add --progressive-size'),
    (['--progressive-size', '16', '--progressive-epochs', '3,1'], 'mxnet', 'expected 0 <= START <= END'),
])
def test_data_flags_that_would_be_ignored_or_cannot_work_are_refused(flags, backend, message):
    argv = ['--data-backend', backend, '--image-shape', '3,32,32', '--data-val-resize', '32'] + flags
    with pytest.raises(RecipeError, match=message):
        data.check_data_flags(resolved(argv), train.parse_flags(argv)[1].given)


def test_native_augmentations_and_aspect_range_none(digits):
    """ImageRecordIter's own augmentations run, and --min-random-aspect-ratio None means [1 - max, 1 + max]."""
    args = resolved(digits_flags(digits) + ['--data-backend', 'mxnet', '--random-resized-crop', '0',
                                            '--random-crop', '1', '--max-random-rotate-angle', '10',
                                            '--brightness', '0.2', '--min-random-aspect-ratio', 'None',
                                            '--max-random-aspect-ratio', '0.25'])
    data.check_data_flags(args, frozenset())
    assert preset.TrainingPreset.of(args).aspect_ratio == (0.75, 1.25)
    train, _ = get_loaders(args, 0, 1, val=False)
    first, again = (next(train.epoch(0)).data[0].asnumpy() for _ in range(2))
    np.testing.assert_array_equal(first, again)           # augmentation seeded per epoch, too
    assert first.shape == (16, 3, 32, 32) and np.isfinite(first).all()


# ---- batches on the worker's devices (CPU contexts stand for GPUs) ------------------------------------------

def test_synthetic_batches_live_on_the_workers_devices():
    """No host-to-device copy per step: the fixed batch is made on the worker's device, or one slice per
    device with several, with the values of the host batch."""
    flags = ['--data-backend', 'synthetic', '--batch-size', '8', '--image-shape', '3,16,16', '--num-classes', '10']
    reference = synthetic.SyntheticLoader(contract.Dataset.of(resolved(flags)), 0, 1, True).batch
    batch = next(synthetic.SyntheticLoader(contract.Dataset.of(resolved(flags)), 0, 1, True,
                                           contexts=[mx.cpu(1)]).epoch(0))
    assert batch.data[0].context == mx.cpu(1) and batch.label[0].context == mx.cpu(1)
    np.testing.assert_array_equal(batch.data[0].asnumpy(), reference.data[0].asnumpy())
    batch = next(synthetic.SyntheticLoader(contract.Dataset.of(resolved(flags)), 0, 1, True,
                                           contexts=[mx.cpu(1), mx.cpu(2)]).epoch(0))
    assert [p.context for p in batch.data[0]] == [mx.cpu(1), mx.cpu(2)] == [p.context for p in batch.label[0]]
    np.testing.assert_array_equal(contract.joined(batch.data[0]).asnumpy(), reference.data[0].asnumpy())
    np.testing.assert_array_equal(contract.joined(batch.label[0]).asnumpy(), reference.label[0].asnumpy())


def test_native_float16_batches_are_cast_on_their_device(digits, monkeypatch):
    """--data-backend mxnet with float16: ImageRecordIter in MXNet 1.9.1 makes float32, uint8 or int8 (float16
    is 'unknown dtype for ImageRecordIter2'), so each device's slice is copied there and cast there, not on
    the host's threads; the values are the host cast's."""
    flags = digits_flags(digits, batch=16) + ['--data-backend', 'mxnet']
    reference = next(iter(data.RecordLoader.of(resolved(flags), 0, 1, True).epoch(0))).data[0].asnumpy()
    args = resolved(flags, dtype='float16')
    casts, astype = [], mx.nd.NDArray.astype

    def recording_astype(array, dtype, *more, **options):
        casts.append((array.context, np.dtype(dtype)))
        return astype(array, dtype, *more, **options)
    monkeypatch.setattr(mx.nd.NDArray, 'astype', recording_astype)
    batch = next(iter(data.RecordLoader.of(args, 0, 1, True, contexts=[mx.cpu(1)]).epoch(0)))
    assert batch.data[0].context == mx.cpu(1) and batch.data[0].dtype == np.float16
    assert [context for context, dtype in casts if dtype == np.float16] == [mx.cpu(1)]
    np.testing.assert_array_equal(batch.data[0].asnumpy(), reference.astype(np.float16))


def test_dali_outputs_are_copied_synchronously():
    """A GPU output is copied with non_blocking=False into the array's own memory (DALI's feed_ndarray copies
    without waiting and MXNet would read on another stream); a CPU output lands whole."""
    import ctypes
    import dali
    from nvidia.dali.backend import TensorCPU

    class FakeGpuOutput:
        def __init__(self):
            self.calls = []

        def shape(self):
            return [2, 3]

        def copy_to_external(self, pointer, **options):
            self.calls.append((pointer.value, options))

    array = mx.nd.empty((2, 3))
    expected = ctypes.c_void_p()
    mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(expected))
    output = FakeGpuOutput()
    dali.copy_output(output, array, on_gpu=True)
    assert output.calls == [(expected.value, {'cuda_stream': None, 'non_blocking': False})]
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    dali.copy_output(TensorCPU(values), array, on_gpu=False)
    np.testing.assert_array_equal(array.asnumpy(), values)
    with pytest.raises(ValueError, match='shape'):
        dali.copy_output(TensorCPU(values), mx.nd.empty((3, 2)), on_gpu=False)


@pytest.mark.parametrize('backend', REAL + ['synthetic'])
def test_training_and_validation_images_have_their_own_shapes(digits, backend):
    """--val-image-shape: validation batches (and pred's image) at the test size, training batches at
    --image-shape."""
    args = resolved(digits_flags(digits) + ['--data-backend', backend, '--image-shape', '3,32,32',
                                            '--val-image-shape', '3,40,40', '--data-val-resize', '46',
                                            '--num-examples', '64'])
    train, val = get_loaders(args, 0, 1)
    assert next(train.epoch(0)).data[0].shape[1:] == (3, 32, 32)
    assert next(val.epoch(0)).data[0].shape[1:] == (3, 40, 40)
    image = next((digits / 'images' / 'val' / 'digit_1').iterdir())
    assert validation_resize.load_image(str(image), contract.Images.of(args)).shape == (1, 3, 40, 40)
    args = resolve.with_values(args, val_image_shape=(4, 40, 40))   # channels: --image-shape's (the runner's 4 on GPUs)
    assert contract.Images.of(args).shape_of(training=False) == (3, 40, 40)
