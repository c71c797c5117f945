"""The native training loader's temporary chunk files (issue 24): constructing an ImageRecordIter lists the
folder of its .rec and .idx and stats every entry there (MXNet's dmlc-core), so a file of another chunk
removed during that listing made the construction fail ("LocalFileSystem.GetPathInfo: ... No such file or
directory"), about one epoch in 20. These tests pin the ordering down deterministically instead of waiting
for the race: what each construction lists (training chunks and validation), and that no iterator outlives
its files or leaves files behind."""
import gc
import os
import threading
import weakref

import mxnet as mx
import numpy as np
import pytest

import data
from conftest import resolved
from test_data import training_loader, write_rec
from train import get_loaders

pytestmark = pytest.mark.unit

CHUNK_IMAGES = 16           # chunks of 2 batches of 8: 7 chunks in an epoch of 100 records
RECORDS, BATCH = 100, 8


def small_chunk_loader(tmp_path, monkeypatch):
    monkeypatch.setattr(data, 'CHUNK_IMAGES', CHUNK_IMAGES)
    rec, idx = write_rec(str(tmp_path / 'd'), [i % 3 for i in range(RECORDS)], size=(8, 8))
    return training_loader(rec, idx, 'mxnet', batch=BATCH, side=8)


def watch_constructions(monkeypatch, on_construct):
    """Call on_construct(rec, idx, iterator) after each ImageRecordIter the loader makes."""
    construct = mx.io.ImageRecordIter

    def watched(**kwargs):
        iterator = construct(**kwargs)
        on_construct(kwargs['path_imgrec'], kwargs['path_imgidx'], iterator)
        return iterator
    monkeypatch.setattr(mx.io, 'ImageRecordIter', watched)


def test_each_chunk_iterator_lists_only_its_own_files(tmp_path, monkeypatch):
    """The next chunk is constructed while the current one is read and then removed: the folder listed by
    the construction must not hold the current chunk's files. The consumer waits for chunk k+1's
    construction before it finishes chunk k, the ordering in which the removal raced the listing."""
    loader = small_chunk_loader(tmp_path, monkeypatch)
    listings, constructed = [], [threading.Event() for _ in range(100)]

    def record(rec, idx, _):
        listings.append((sorted(os.listdir(os.path.dirname(rec))), sorted(os.listdir(os.path.dirname(idx))),
                         sorted({os.path.basename(rec), os.path.basename(idx)})))
        constructed[len(listings) - 1].set()
    watch_constructions(monkeypatch, record)
    per_chunk = CHUNK_IMAGES // BATCH
    last_chunk = (loader.num_batches - 1) // per_chunk
    for epoch, start in ((0, 0), (1, 5)):
        before, first_chunk = len(listings), start // per_chunk
        for index, _ in enumerate(loader.epoch(epoch, start), start):
            chunk = index // per_chunk
            if chunk < last_chunk:      # hold this chunk until the next one is constructed
                assert constructed[before + chunk - first_chunk + 1].wait(60)
        assert len(listings) - before == last_chunk - first_chunk + 1
    for rec_folder, idx_folder, own in listings:
        assert rec_folder == own and idx_folder == own
    assert os.listdir(loader.workdir) == []


def test_no_iterator_outlives_its_files_and_nothing_is_left(tmp_path, monkeypatch):
    """An iterator's files exist until the iterator itself is freed (its C++ destructor joins the threads
    that read them), complete or abandoned epoch alike; nothing stays in the loader's folder after an
    epoch, and the folder goes with the loader."""
    loader = small_chunk_loader(tmp_path, monkeypatch)
    freed_with_files, alive = [], []

    def track(rec, idx, iterator):
        alive.append(weakref.ref(iterator, lambda _: freed_with_files.append(
            os.path.exists(rec) and os.path.exists(idx))))
    watch_constructions(monkeypatch, track)
    assert len(list(loader.epoch(0))) == loader.num_batches
    assert os.listdir(loader.workdir) == []
    abandoned = loader.epoch(1, 3)
    for _ in zip(range(4), abandoned):      # batches 3 to 6: stopped in chunk 3, chunk 4 read ahead
        pass
    abandoned.close()
    del abandoned
    assert os.listdir(loader.workdir) == []
    assert [ref() for ref in alive] == [None] * len(alive) and len(alive) == 7 + 4
    assert freed_with_files == [True] * len(alive)
    workdir = loader.workdir
    del loader
    gc.collect()
    assert not os.path.exists(workdir)


def test_validation_iterator_lists_only_its_own_files(tmp_path, monkeypatch):
    """The validation data's folder may hold other files that come and go (/tmp, another job's output): the
    iterator must not list them."""
    rec, idx = write_rec(str(tmp_path / 'd'), [i % 3 for i in range(20)], size=(8, 8))
    (tmp_path / 'd' / 'another-job.log').write_text('written and removed by someone else\n')
    args = resolved(['--data-train', rec, '--data-val', rec, '--num-classes', '3', '--batch-size', '8',
                     '--image-shape', '3,8,8', '--data-val-resize', '8', '--data-backend', 'mxnet'])
    listings = []
    watch_constructions(monkeypatch, lambda rec, idx, _: listings.append(
        sorted(os.listdir(os.path.dirname(rec))) == sorted({os.path.basename(rec), os.path.basename(idx)})
        and os.path.dirname(rec) == os.path.dirname(idx)))
    val = get_loaders(args, 0, 1, train=False)[1]
    labels = np.concatenate([b.label[0].asnumpy()[:8 - b.pad] for b in val.epoch(0)])
    assert labels.tolist() == [i % 3 for i in range(20)] and listings == [True]
    workdir = val.workdir
    del val
    gc.collect()
    assert not os.path.exists(workdir)
