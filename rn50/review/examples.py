"""The images a review shows: the worst validation images as the network saw them (the validation crop of their
records, with the file each came from), and the first training batch after augmentation.

    names = file_names(records)                             # record position -> file, from the .lst beside the .rec
    tiles = validation_crops(records, positions, prepare, images)
    picture = TrainingBatchPicture(path, images, class_names, 'dali-cpu')   # fit.train shows it the run's first batch
"""
import logging
import os

import numpy as np

from rn50 import files
from rn50.review import pictures

log = logging.getLogger(__name__)

SHOWN_TRAINING_IMAGES = 16


def file_names(records):
    """{record position: the file it was made from} of a records.RecordFile, from the header ids and the .lst
    beside the .rec (prepare_dataset.py and im2rec.py write it: index, label, path); {} without a .lst (an im2rec
    set copied without its list names no file: its records are shown by position)."""
    listing = os.path.splitext(records.rec_path)[0] + '.lst'
    if not os.path.exists(listing):
        return {}
    paths = {}
    with open(listing, encoding='utf-8', errors='replace') as f:
        for line in f:
            fields = line.rstrip('\n').split('\t')
            if len(fields) >= 3 and fields[0].strip().isdigit():
                paths[int(fields[0])] = fields[-1]
    ids = records.record_ids(range(len(records)))
    return {position: paths[record_id] for position, record_id in enumerate(ids) if record_id in paths}


def validation_crops(records, positions, prepare, images):
    """(H, W, 3) uint8 pictures of the records at `positions` as validation gives them to the network:
    `prepare(encoded bytes, name)` is pred's preprocessing (a batch of 1, normalised), undone for display with
    `images`' normalisation (the run's contract.Images)."""
    payloads, _ = records.read(positions)
    crops = [prepare(bytes(payload), f'record {position}').asnumpy()
             for payload, position in zip(payloads, positions)]
    return list(pictures.displayable(np.concatenate(crops), images.mean, images.std, images.layout))


class TrainingBatchPicture:
    """The first training batch of a run after augmentation, as the network sees it (de-normalised, labelled
    with class names), written once to `path` (a JPEG): the way to see that a crop lost the object or that an
    augmentation is too strong. `images`: the run's contract.Images; `names`: the class names. A workspace that
    has the picture keeps it (a resumed run does not draw its own batch again). `backend`: the --data-backend that
    read the batch, which the log line names."""

    def __init__(self, path, images, names, backend, count=SHOWN_TRAINING_IMAGES):
        self.path, self.images, self.names, self.backend, self.count = path, images, names, backend, count
        self.pending = not os.path.exists(path)

    def __call__(self, images, labels):
        """Draw the batch `images` (the first device's slice, an NDArray) with its `labels`."""
        if not self.pending:
            return
        self.pending = False
        shown = images[:self.count].astype('float32').asnumpy()
        tiles = pictures.displayable(shown, self.images.mean, self.images.std, self.images.layout)
        classes = labels[:self.count].asnumpy().astype(np.int64)
        captions = [[pictures.short(self.names[c] if 0 <= c < len(self.names) else f'label {c}', 28)]
                    for c in classes]
        picture = pictures.drawn('the first training batch', pictures.sheet_jpeg, list(tiles), captions)
        if picture is None:
            return
        with files.atomic_path(self.path) as tmp, open(tmp, 'wb') as f:
            f.write(picture)
        log.info('The first training batch after augmentation (%s, %dx%d): %s', self.backend, *tiles.shape[1:3],
                 self.path)
