"""The training order of the real backends: a fresh permutation of the whole file every epoch, a function of
(seed, epoch) dealt over the global ranks; exact seeking; start-up checks that scale; bad records named; repeated
augmentation (--aug-repeats) dealt over the workers, and the log line saying where its copies go."""
import logging
import os
import struct
import time

import numpy as np
import pytest

import data
from rn50.data import crop_windows
from rn50.data import records
from train import get_loaders
from rn50.errors import RecipeError
from conftest import digits_flags, resolved
from test_data import real_labels, training_loader, unique_label_args, write_rec

pytestmark = pytest.mark.unit

REAL = ['mxnet', 'dali-cpu']


def epoch_labels(args, workers, epoch, start=0):
    """Per worker, the labels (= record indices) of its batches of `epoch` from `start`, and the pads."""
    result = []
    for rank in range(workers):
        train, _ = get_loaders(args, rank, workers, val=False)
        result.append([(b.label[0].asnumpy().astype(int).tolist(), b.pad) for b in train.epoch(epoch, start)])
    return result


@pytest.mark.parametrize('backend', REAL)
def test_every_epoch_is_a_fresh_permutation_of_the_whole_file(tmp_path, backend):
    args = unique_label_args(tmp_path, backend, count=29, batch=6)     # 2 workers x 3 per worker
    epochs = []
    for epoch in (0, 1):
        batches = epoch_labels(args, 2, epoch)
        assert len(batches[0]) == len(batches[1]) == 5                  # ceil(ceil(29 / 2) / 3)
        real = [label for worker in batches for labels, pad in worker for label in labels[:len(labels) - pad]]
        assert sorted(real) == list(range(29))                          # each record exactly once
        # a global batch (batch i of every worker) is the slice [6i, 6i + 6) of the epoch's order
        order = records.epoch_order(29, 29, 5, epoch)
        for i in range(5):
            expected = order[6 * i:6 * i + 6]
            got = [batches[r][i][0][j] for j in range(3) for r in range(2)]
            real_count = len(expected)
            assert got[:real_count] == expected.tolist()
        epochs.append(real)
    # the records of worker 0 are not the same set in both epochs (no stick-to-shard)
    assert epochs[0] != epochs[1]
    first = [label for labels, pad in epoch_labels(args, 2, 0)[0] for label in labels[:len(labels) - pad]]
    again = [label for labels, pad in epoch_labels(args, 2, 0)[0] for label in labels[:len(labels) - pad]]
    assert first == again                                               # same (seed, epoch): same order


def test_filler_is_reported_and_steps_are_equal():
    shard = records.TrainingShard(total=10, count=10, rank=2, num_workers=3, batch_size=2, seed=0)
    assert shard.num_batches == 2 and shard.real_samples == 3
    pads = [shard.batch(0, i)[1] for i in range(2)]
    assert pads == [0, 1]                                               # positions 2, 5 | 8, 11 (filler)
    others = [records.TrainingShard(10, 10, r, 3, 2, 0).num_batches for r in range(3)]
    assert others == [2, 2, 2]
    longer = records.TrainingShard(total=4, count=10, rank=0, num_workers=1, batch_size=5, seed=1)
    indices = np.concatenate([longer.batch(3, i)[0] for i in range(2)])
    assert sorted(indices[:4]) == [0, 1, 2, 3] and sorted(indices[4:8]) == [0, 1, 2, 3]


def test_order_quality_statistics():
    """Order of epoch 1 against epoch 0 over 20,000 records, 2 workers, batch 64: no position correlation
    and no more batch-mate recurrence than fresh random batches (the issue's measure)."""
    count, workers, batch = 20000, 2, 64
    position, batch_id = {}, {}
    for epoch in (0, 1):
        position[epoch] = np.empty(count)
        batch_id[epoch] = np.empty(count, np.int64)
        for rank in range(workers):
            shard = records.TrainingShard(count, count, rank, workers, batch, seed=7)
            for i in range(shard.num_batches):
                members, pad = shard.batch(epoch, i)
                members = members[:batch - pad]
                position[epoch][members] = i * batch + np.arange(len(members))
                batch_id[epoch][members] = i * workers + rank
    r = np.corrcoef(position[0], position[1])[0, 1]
    same = 0
    for group in np.unique(batch_id[0]):
        members = batch_id[1][batch_id[0] == group]
        _, counts = np.unique(members, return_counts=True)
        same += (counts * (counts - 1) // 2).sum()
    pairs = sum(c * (c - 1) // 2 for c in np.unique(batch_id[0], return_counts=True)[1])
    recurrence = same / pairs / ((batch - 1) / (count - 1))
    assert abs(r) < 0.05 and recurrence < 1.3


@pytest.mark.parametrize('backend,extra', [(backend, []) for backend in REAL] + [
    ('dali-cpu', ['--auto-augment', 'ta_wide', '--random-erase', '0.5', '--random-erase-mode', 'pixel']),
    ('dali-cpu', ['--auto-augment', 'imagenet'])])
def test_resume_lands_on_the_right_batch_of_a_kept_pipeline(tmp_path, backend, extra):
    args = unique_label_args(tmp_path, backend, count=40, batch=4, extra=extra)
    train, _ = get_loaders(args, 0, 1, val=False)
    full = [(b.data[0].asnumpy().copy(), b.label[0].asnumpy().copy()) for b in train.epoch(2)]
    assert len(full) == 10
    partial = train.epoch(1)
    next(partial)                                    # an abandoned epoch: the loader must not carry it over
    del partial
    for start in (7, 3):
        tail = [(b.data[0].asnumpy().copy(), b.label[0].asnumpy().copy()) for b in train.epoch(2, start)]
        assert len(tail) == 10 - start
        for (x, y), (tx, ty) in zip(full[start:], tail):
            np.testing.assert_array_equal(y, ty)
            np.testing.assert_array_equal(x, tx)     # the same augmentation, too
    fresh, _ = get_loaders(args, 0, 1, val=False)
    np.testing.assert_array_equal(next(fresh.epoch(2, 9)).label[0].asnumpy(), full[9][1])


def test_dali_builds_training_and_validation_pipelines_before_the_first_step(tmp_path):
    """Twin of dali-gpu's memory order: the validation pipeline must exist before training fills the GPU's
    memory pool, not be built at the first validation after a training epoch."""
    args = unique_label_args(tmp_path, 'dali-cpu', count=12, batch=6)
    train, val = get_loaders(args, 0, 1)
    assert [len(train.pipes), len(val.pipes)] == [1, 1]
    built = val.pipes[0]
    assert real_labels(train, 0) and real_labels(val, 0) == list(range(12)) and val.pipes[0] is built


def test_dali_keeps_its_pipeline_across_epochs_and_wraps(tmp_path):
    args = unique_label_args(tmp_path, 'dali-cpu', count=24, batch=6)
    train, val = get_loaders(args, 0, 1)
    for epoch in range(3):
        assert sorted(real_labels(train, epoch)) == list(range(24))
        assert real_labels(val, epoch) == list(range(24))
    pipes = train.pipes
    seen = []
    for batch in train.epoch(3):                     # --benchmark-iters shorter than the epoch: abandon it
        seen.append(batch.label[0].asnumpy().tolist())
        break
    assert sorted(real_labels(train, 3)) == list(range(24)) and train.pipes is pipes


@pytest.mark.parametrize('backend', REAL)
def test_bad_label_named_when_its_batch_is_read(tmp_path, backend):
    labels = [i % 3 for i in range(records.STARTUP_CHECKS * 2)]
    skipped = next(i for i in range(len(labels))
                   if i not in set(np.linspace(0, len(labels) - 1, records.STARTUP_CHECKS).astype(int)))
    labels[skipped] = 9                               # not among the records checked at start-up
    rec, idx = write_rec(str(tmp_path / 'b'), labels, size=(8, 8))
    train = training_loader(rec, idx, backend, batch=64, side=8)
    with pytest.raises(RecipeError, match=f'training record {skipped} of {rec} has label 9, outside \\[0, 3\\)'):
        list(train.epoch(0))


def test_index_parsing_is_fast_and_strict(tmp_path):
    count = 1281167
    offsets = np.arange(count, dtype=np.int64) * 40
    path = str(tmp_path / 'big.idx')
    with open(path, 'w') as f:
        f.write(''.join(f'{i}\t{o}\n' for i, o in enumerate(offsets)))
    begin = time.time()
    parsed = records.read_index(path)
    assert time.time() - begin < 3 and np.array_equal(parsed, offsets)
    (tmp_path / 'bad.idx').write_text('0\t0\n1\t40\n2\n')
    with pytest.raises(RecipeError, match='line 3 is not "key<TAB>offset"'):
        records.read_index(str(tmp_path / 'bad.idx'))
    (tmp_path / 'blank.idx').write_text('0\t0\n\n1\t40')
    assert records.read_index(str(tmp_path / 'blank.idx')).tolist() == [0, 40]


def test_multipart_record_is_joined(tmp_path):
    """A payload containing the RecordIO magic word is stored in parts; the reader joins them."""
    import mxnet as mx
    magic = struct.pack('<I', records.RECORD_MAGIC)
    image = b'\xff\xd8' + b'ab' + magic + b'cdefgh' + magic + b'ij'
    folder = str(tmp_path / 'm')
    os.makedirs(folder)
    writer = mx.recordio.MXIndexedRecordIO(os.path.join(folder, 'd.idx'), os.path.join(folder, 'd.rec'), 'w')
    for i in range(3):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), image))
    writer.close()
    mapped = records.RecordFile(os.path.join(folder, 'd.rec'), os.path.join(folder, 'd.idx'), 3, 'training')
    payloads, labels = mapped.read([2, 0])
    assert [bytes(p) for p in payloads] == [image, image] and labels.tolist() == [2, 0]
    plain = records.RecordFile(os.path.join(folder, 'd.rec'), os.path.join(folder, 'd.idx'), 3, 'training',
                               use_mmap=False)             # --dali-dont-use-mmap: os.pread, same bytes
    assert [bytes(p) for p in plain.read([2, 0])[0]] == [image, image]
    whole, _ = mapped.read([1], whole=True)            # as stored: all parts, for the native loader's chunks
    stored = open(os.path.join(folder, 'd.rec'), 'rb').read()[mapped.offsets[1]:mapped.offsets[2]]
    assert bytes(whole[0]) == stored


def test_random_crops_follow_the_area_and_aspect_rule():
    rng = np.random.default_rng(0)
    sizes = np.array([[375, 500]] * 4000 + [[10, 1000]] * 10, dtype=np.float64)
    anchors, shapes = crop_windows.random_crops(sizes, rng, (0.08, 1.0), (3 / 4, 4 / 3))
    assert (anchors >= 0).all() and (anchors + shapes <= 1 + 1e-6).all()
    area = shapes[:4000].prod(axis=1)
    aspect = shapes[:4000, 0] * 500 / (shapes[:4000, 1] * 375)
    assert area.min() > 0.07 and area.max() <= 1 and 0.74 < aspect.min() and aspect.max() < 1.35
    # a 1:100 image fits no draw: the whole height, the widest allowed crop, centered
    np.testing.assert_allclose(shapes[-1], [13 / 1000, 1], atol=1e-6)
    assert crop_windows.image_size(b'\xff\xd8\xff\xe0\x00\x04ab\xff\xc0\x00\x11\x08\x01\x77\x01\xf4rest') == (375, 500)
    assert crop_windows.image_size(b'not an image at all') is None


def test_the_fallback_window_is_placed_at_random_as_dalis():
    """A 100x1000 image (aspect 10) mostly exhausts the 10 attempts: the fallback, the whole height by the
    widest allowed width (133), lands at many positions inside the image, as DALI's RandomCropGenerator
    places it (186 distinct positions in 256 draws there), the same ones for the same seed."""
    sizes = np.array([[100, 1000]] * 256, dtype=np.float64)
    anchors, shapes = crop_windows.random_crops(sizes, np.random.default_rng(3), (0.08, 1.0), (3 / 4, 4 / 3))
    fallback = np.all(np.isclose(shapes, [133 / 1000, 1]), axis=1)
    assert fallback.sum() > 150
    x = np.round(anchors[fallback, 0] * 1000).astype(int)
    assert len(set(x.tolist())) > 120 and x.min() >= 0 and x.max() <= 1000 - 133
    assert (anchors[fallback, 1] == 0).all() and (anchors + shapes <= 1 + 1e-6).all()
    again, _ = crop_windows.random_crops(sizes, np.random.default_rng(3), (0.08, 1.0), (3 / 4, 4 / 3))
    np.testing.assert_array_equal(again, anchors)
    # with --max-random-area below 1 the fallback shrinks to that area, as DALI's does
    _, small = crop_windows.random_crops(np.array([[100, 1000]] * 64, np.float64), np.random.default_rng(3), (0.08, 0.1),
                                 (3 / 4, 4 / 3))
    assert small.prod(axis=1).max() < 0.105          # rounding of drawn windows aside; 0.133 unshrunk


def test_unfused_decoder_crops_the_same_windows(tmp_path):
    """--dali-fuse-decoder 0 decodes whole images and slices the same numpy-drawn windows."""
    batches = {}
    for fuse in ('0', '1'):
        args = unique_label_args(tmp_path / fuse, 'dali-cpu', count=12, batch=4, extra=['--dali-fuse-decoder', fuse])
        train, _ = get_loaders(args, 0, 1, val=False)
        batches[fuse] = [b.data[0].asnumpy().copy() for b in train.epoch(1)]
    for fused, unfused in zip(batches['1'], batches['0']):
        np.testing.assert_allclose(fused, unfused, atol=0.05)


@pytest.mark.parametrize('workers', [1, 2, 4])
@pytest.mark.parametrize('repeats', [2, 3])
def test_repeated_augmentation_puts_the_copies_of_an_image_on_different_workers(workers, repeats):
    """--aug-repeats N: an epoch as long as without, made of ceil(count / N) records N times each, whose copies
    go to min(N, workers) different workers; another subset every epoch."""
    count, batch = 60, 4
    subsets = []
    for epoch in (0, 1):
        where = {}
        for rank in range(workers):
            shard = records.TrainingShard(count, count, rank, workers, batch, seed=3, repeats=repeats)
            assert shard.num_batches == records.TrainingShard(count, count, rank, workers, batch, seed=3).num_batches
            for index in range(shard.num_batches):
                indices, pad = shard.batch(epoch, index)
                for record in indices[:len(indices) - pad]:
                    where.setdefault(int(record), []).append(rank)
        assert sum(map(len, where.values())) == count and len(where) == -(-count // repeats)
        assert sorted(len(ranks) for ranks in where.values())[1:] == [repeats] * (len(where) - 1)
        assert all(len(set(ranks)) == min(len(ranks), workers) for ranks in where.values())
        subsets.append(set(where))
    assert subsets[0] != subsets[1]


@pytest.mark.parametrize('backend', REAL)
def test_repeated_augmentation_through_the_loaders_of_two_workers(tmp_path, backend):
    """The loaders follow the repeated order: each of 12 records twice in the epoch, once on each worker."""
    args = unique_label_args(tmp_path, backend, count=24, batch=8, extra=['--aug-repeats', '2'])
    per_worker = epoch_labels(args, 2, 1)
    seen = [sorted(label for labels, pad in batches for label in labels[:len(labels) - pad])
            for batches in per_worker]
    assert seen[0] == seen[1] and len(seen[0]) == 12 == len(set(seen[0]))


def test_progressive_sizes_follow_ffcvs_rule():
    from rn50.data.resolution import size_at
    sizes = [size_at(epoch, 160, 192, 65, 76, 32) for epoch in range(60, 80)]
    assert sizes[:6] == [160] * 6 and sizes[-4:] == [192] * 4
    assert sizes == sorted(sizes) and set(sizes) == {160, 192}
    assert [size_at(e, 128, 224, 0, 6, 16) for e in range(8)] == [128, 144, 160, 176, 192, 208, 224, 224]
    assert size_at(5, 100, 130, 0, 10, 32) == 128 and size_at(1, 100, 130, 0, 10, 32) == 100   # kept in range


@pytest.mark.parametrize('backend,extra', [('mxnet', []), ('dali-cpu', []),
                                           ('dali-cpu', ['--auto-augment', 'ra', '--random-erase', '1',
                                                         '--random-erase-mode', 'pixel'])])
def test_progressive_resizing_grows_the_training_batches_and_resumes_exactly(tmp_path, backend, extra):
    args = unique_label_args(tmp_path, backend, count=16, batch=4, extra=[
        '--progressive-size', '16', '--progressive-epochs', '0,2', '--progressive-step', '8'] + extra)
    train, val = get_loaders(args, 0, 1)
    for epoch, size in ((0, 16), (1, 24), (2, 32), (5, 32)):
        batches = [b.data[0].asnumpy().copy() for b in train.epoch(epoch)]
        assert {b.shape for b in batches} == {(4, 3, size, size)}, epoch
        resumed = next(get_loaders(args, 0, 1, val=False)[0].epoch(epoch, 2)).data[0].asnumpy()
        np.testing.assert_array_equal(resumed, batches[2])
    assert next(val.epoch(0)).data[0].shape == (4, 3, 32, 32)


def test_repeats_on_fewer_workers_say_where_the_copies_go(digits, caplog):
    args = resolved(digits_flags(digits) + ['--aug-repeats', '4', '--data-backend', 'mxnet'])
    with caplog.at_level(logging.INFO, logger='rn50.data.records'):
        data.RecordLoader.of(args, 0, 1, training=True)
    assert ('--aug-repeats 4 with 1 worker: the 4 copies of an image are dealt over the workers, so up to 4 of them '
            'sit side by side in one worker\'s batch') in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='rn50.data.records'):
        data.RecordLoader.of(args, 0, 4, training=True)       # as many workers as repeats: one copy each
        data.RecordLoader.of(args, 1, 2, training=True)       # rank 1 of 2: rank 0 says it
    assert caplog.text == ''
