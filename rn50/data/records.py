"""RecordIO files and which of their records a worker reads.

    dataset = RecordFile('train.rec', 'train.idx', num_classes=1000, what='training')
    images, labels = dataset.read(indices)                      # encoded images and checked labels
    with RecordWriter('val.rec', 'val.idx') as writer:          # prepare_dataset.py's files, as im2rec's
        writer.write(key, label, image_bytes)
    order = epoch_order(len(dataset), count, seed, epoch)      # a fresh permutation per (seed, epoch)
    shard = TrainingShard(len(dataset), count, rank, workers, batch_size, seed)

The loaders of data.py (native) and dali.py read through these: the .idx parsed in one numpy call, record
headers and labels checked as their batch is read (with a sample checked at start-up), the order of an
epoch a function of (seed, epoch) alone, dealt over the global ranks so that every worker makes the same
number of steps and a resume can start at any batch.
"""
import io
import logging
import mmap
import os
import struct
import warnings

import numpy as np

from rn50.errors import RecipeError, mxnet_message

log = logging.getLogger(__name__)
RECORD_MAGIC = 0xced7230a


# ----------------------------------------------------------------------------------------------------------
# RecordIO files: read record by record, checked as they are read

# Start-up checks read this many record headers (evenly spaced, first and last included): a small dataset is
# checked whole before training, a large one gets each batch's records checked as they are read.
STARTUP_CHECKS = 256


class RecordFile:
    """A .rec file and its .idx. Opening it parses the index (one numpy call, not a Python loop: 1.28 M
    entries in well under a second) and checks STARTUP_CHECKS records; `read` checks every record it returns
    (the index lands on a record header, the label is an integer in [0, num_classes)), so a bad record fails
    with its file and index before its batch reaches the network. Records are read through an mmap (zero
    copy: the returned views point into the page cache) or, with use_mmap=False, with positioned reads
    (os.pread, which releases the GIL while it waits: better on a network filesystem, where a page fault in
    a reading thread would hold the GIL)."""

    def __init__(self, rec_path, idx_path, num_classes, what, use_mmap=True):
        if not rec_path or not os.path.exists(rec_path):
            raise RecipeError(f'{what} data {rec_path!r} not found' + (
                '; without validation data, train with --mode train' if what == 'validation' else ''))
        idx_path = idx_path or os.path.splitext(rec_path)[0] + '.idx'
        if not os.path.exists(idx_path):
            raise RecipeError(f'{what} index {idx_path!r} not found: make it with scripts/prepare_dataset.py '
                              '(or im2rec.py) next to the .rec, or pass --data-{train,val}-idx')
        self.rec_path, self.idx_path, self.what, self.num_classes = rec_path, idx_path, what, num_classes
        self.offsets = read_index(idx_path)
        if len(self.offsets) == 0:
            raise RecipeError(f'{what} index {idx_path} lists no records')
        self.size = os.path.getsize(rec_path)
        outside = np.flatnonzero((self.offsets < 0) | (self.offsets + 32 > self.size))
        if len(outside):
            self._not_a_record(int(outside[0]))
        self.fd = os.open(rec_path, os.O_RDONLY)
        self.view = memoryview(mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)) if use_mmap else None
        self.read(np.unique(np.linspace(0, len(self) - 1, min(len(self), STARTUP_CHECKS)).astype(np.int64)))

    def __len__(self):
        return len(self.offsets)

    def __del__(self):
        if getattr(self, 'fd', None) is not None:
            os.close(self.fd)       # the mmap, if any, goes with the last view into it
            self.fd = None

    def _bytes(self, length, offset):
        if self.view is not None:
            return self.view[offset:offset + length]
        return os.pread(self.fd, length, offset)

    def __getstate__(self):
        raise TypeError('RecordFile holds an open file; open it again in the other process')

    def _not_a_record(self, index):
        raise RecipeError(f'{self.what} index {self.idx_path} does not match {self.rec_path}: entry {index} '
                          f'(offset {int(self.offsets[index])}) is not a record. Rebuild the index with the data')

    def read(self, indices, whole=False):
        """(list of bytes-like, float32 labels) for the records `indices`: the encoded images, or with
        whole=True the complete records as stored (header and padding included, ready to be written to
        another .rec)."""
        payloads, labels = [], np.empty(len(indices), np.float32)
        for n, index in enumerate(indices):
            offset = int(self.offsets[index])
            head = self._bytes(32, offset)
            if len(head) < 32:
                self._not_a_record(index)
            magic, length, flag, label = struct.unpack_from('<IIIf', head)
            length, continued = length & ((1 << 29) - 1), length >> 29
            if magic != RECORD_MAGIC or offset + 8 + length > self.size or length < 24 + 4 * flag:
                self._not_a_record(index)
            labels[n] = label if flag == 0 else np.nan
            if continued:      # rare: a payload containing the magic word is stored in parts
                record, payload = self._read_parts(index, offset)
                payloads.append(record if whole else payload[24 + 4 * flag:])
            elif whole:
                payloads.append(self._bytes(8 + (length + 3) // 4 * 4, offset))
            else:
                payloads.append(self._bytes(length - 24 - 4 * flag, offset + 32 + 4 * flag))
        bad = np.flatnonzero(~((labels >= 0) & (labels < self.num_classes) & (labels == np.floor(labels))))
        if len(bad):
            raise RecipeError(f'{self.what} record {int(indices[bad[0]])} of {self.rec_path} has label '
                              f'{labels[bad[0]]:g}, outside [0, {self.num_classes}): check --num-classes')
        return payloads, labels

    def record_ids(self, indices):
        """The ids the records `indices` carry in their headers: the .lst index of the file each was made from, as
        im2rec.py and prepare_dataset.py write them (the .lst beside the .rec names the file)."""
        ids = []
        for index in indices:
            head = self._bytes(32, int(self.offsets[index]))
            magic, _, _, _, record_id, _ = struct.unpack_from('<IIIfQQ', head) if len(head) == 32 else (0,) * 6
            if magic != RECORD_MAGIC:
                self._not_a_record(index)
            ids.append(int(record_id))
        return ids

    def _read_parts(self, index, offset):
        """(stored bytes, joined payload) of a record written in parts (upper 3 bits of the length: 1 first,
        2 middle, 3 last); the parts are joined with the magic word that split them."""
        start, parts = offset, []
        while True:
            head = self._bytes(8, offset)
            magic, length = struct.unpack('<II', head) if len(head) == 8 else (0, 0)
            if magic != RECORD_MAGIC:
                self._not_a_record(index)
            parts.append(bytes(self._bytes(length & ((1 << 29) - 1), offset + 8)))
            offset += 8 + ((length & ((1 << 29) - 1)) + 3) // 4 * 4
            if length >> 29 in (0, 3):
                break
        return bytes(self._bytes(offset - start, start)), struct.pack('<I', RECORD_MAGIC).join(parts)


class RecordWriter:
    """Writes a .rec and its .idx as MXNet's MXIndexedRecordIO does, byte for byte, without MXNet (a dataset's
    preparation needs no MXNet: prepare_dataset.py starts in a tenth of its import). A record is the magic word,
    its length (the upper 3 bits flag a record stored in parts), the payload and zero padding to 4 bytes. The
    payload is a 24-byte header (flag 0, the float label, the id, 0: im2rec's IRHeader) and the image. A
    payload holding the magic word at a 4-byte boundary is stored in parts split there (flag 1 first, 2 middle, 3
    last; the reader joins them with the magic word: RecordFile.read). The .idx has a "key<TAB>byte offset" line
    per record.

        with RecordWriter('train.rec', 'train.idx') as writer:
            writer.write(key, label, image_bytes)
    """

    def __init__(self, rec_path, idx_path):
        self.rec = open(rec_path, 'wb')
        self.idx = open(idx_path, 'w')

    def __enter__(self):
        return self

    def __exit__(self, *failure):
        self.rec.close()
        self.idx.close()

    def write(self, key, label, image, record_id=None):
        """Record `key` (its .idx key, and its header's id unless `record_id`) of class `label` and image bytes."""
        self.idx.write(f'{key}\t{self.rec.tell()}\n')
        payload = struct.pack('<IfQQ', 0, label, key if record_id is None else record_id, 0) + bytes(image)
        magic = struct.pack('<I', RECORD_MAGIC)
        cuts = [i for i in range(0, len(payload) - 3, 4) if payload[i:i + 4] == magic]
        start = 0
        for n, cut in enumerate(cuts):
            self.rec.write(magic + struct.pack('<I', ((1 if n == 0 else 2) << 29) | (cut - start)) + payload[start:cut])
            start = cut + 4
        self.rec.write(magic + struct.pack('<I', ((3 if cuts else 0) << 29) | (len(payload) - start)) + payload[start:])
        self.rec.write(b'\0' * (-len(payload) % 4))


def read_index(idx_path):
    """Byte offsets of the records, in index order, from an im2rec-style .idx (key<TAB>offset lines): one
    numpy parse of the whole file; a file it cannot parse is read again line by line to name the bad line."""
    with open(idx_path, 'rb') as f:
        text = f.read()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        numbers = np.fromstring(text, dtype=np.int64, sep=' ') if text.strip() else np.empty(0, np.int64)
    lines = text.count(b'\n') + (0 if text.endswith(b'\n') or not text else 1)
    if len(numbers) == 2 * lines:
        return numbers[1::2].copy()
    offsets = []
    for number, line in enumerate(text.decode(errors='replace').splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            offsets.append(int(fields[1]))
        except (IndexError, ValueError):
            raise RecipeError(f'{idx_path} line {number} is not "key<TAB>offset": {line.strip()!r}') from None
    return np.array(offsets, dtype=np.int64)


def read_record(f, offset):
    """(header flag, label, image bytes) of the record at `offset` of an open .rec file."""
    f.seek(offset)
    magic, length = struct.unpack('<II', f.read(8))
    payload = f.read(length & ((1 << 29) - 1))
    flag, label = struct.unpack('<If', payload[:8])
    return flag, label, payload[24 + 4 * flag:]


def find_undecodable(records, indices):
    """The first of the records `indices` whose image does not fully decode, else None. Pillow is strict
    about truncated files, as DALI's and OpenCV's decoders are."""
    from PIL import Image
    for index in indices:
        try:
            with Image.open(io.BytesIO(bytes(records.read([index])[0][0]))) as image:
                image.load()
        except RecipeError:
            raise
        except Exception:  # Pillow raises many types for bad data; any of them means undecodable
            return int(index)
    return None


def undecodable_message(records, indices, error):
    """A RecipeError message for a decoder failure among the records `indices` (those in flight): which
    record, and what to do."""
    bad = find_undecodable(records, indices)
    where = f'record {bad} of {records.rec_path} cannot be decoded' if bad is not None else \
        f'decoding {records.rec_path} failed'
    first_line = mxnet_message(error)[:200]
    return f'{where} ({first_line}). Rebuild the dataset with scripts/prepare_dataset.py, which skips ' \
           'unreadable images'


# ----------------------------------------------------------------------------------------------------------
# Which records a worker reads: the epoch order and the shards


def epoch_seed(seed, *keys):
    """A 31-bit seed from --seed (None: 0) and integer keys such as (epoch, rank)."""
    return int(np.random.SeedSequence([seed or 0, *keys]).generate_state(1)[0] & 0x7fffffff)


ORDER_STREAM = 0x0de5   # keys the order's random stream apart from the augmentation streams


def epoch_order(total, count, seed, epoch, repeats=1):
    """The training order of epoch `epoch`: `count` record indices, a fresh permutation of range(total) that
    depends on (seed, epoch) alone (further permutations follow when count > total). numpy's permutation of
    1.28 M indices takes about 30 ms. With `repeats` N (repeated augmentation, --aug-repeats, as timm's and
    torchvision's samplers), the first ceil(count / N) indices of that order each appear N times in a row, cut
    to `count`: an epoch as long as without, whose N copies of an image sit at consecutive positions, which
    TrainingShard deals to N different workers (when there are at least N)."""
    unique = -(-count // repeats)
    passes = [np.random.default_rng([seed or 0, epoch, p, ORDER_STREAM]).permutation(total)
              for p in range(-(-unique // total))]
    order = (np.concatenate(passes) if len(passes) > 1 else passes[0])[:unique]
    return order if repeats == 1 else np.repeat(order, repeats)[:count]


def training_steps(count, num_workers, batch_size):
    """Steps per training epoch, equal on every worker: ceil(ceil(count / workers) / batch_size)."""
    return -(-(-(-count // num_workers)) // batch_size)


class TrainingShard:
    """Worker `rank`'s training batches: the epoch order dealt round-robin over the workers, so sample j of
    batch i is order[(i * batch_size + j) * workers + rank] and a global batch (batch i of every worker) is a
    contiguous slice of the order, the same records for any number of workers. Every worker makes
    num_batches = ceil(ceil(count / workers) / batch_size) steps; positions past `count` are filler (records
    from the start of the order), at the end of the batch and counted in its pad. `repeats`: epoch_order's."""

    def __init__(self, total, count, rank, num_workers, batch_size, seed, repeats=1):
        self.total, self.count, self.rank, self.num_workers = total, count, rank, num_workers
        self.batch_size, self.seed, self.repeats = batch_size, seed, repeats
        self.num_batches = training_steps(count, num_workers, batch_size)
        self.real_samples = len(range(rank, count, num_workers))
        self._cached = (None, None)
        if repeats > num_workers and rank == 0:
            log.info('--aug-repeats %d with %d worker%s: the %d copies of an image are dealt over the workers, so up '
                     'to %d of them sit side by side in one worker\'s batch (each augmented differently); timm\'s and '
                     'torchvision\'s samplers give each copy to another worker, which takes %d workers', repeats,
                     num_workers, 's' if num_workers > 1 else '', repeats, -(-repeats // num_workers), repeats)

    def order(self, epoch):
        if self._cached[0] != epoch:
            self._cached = (epoch, epoch_order(self.total, self.count, self.seed, epoch, self.repeats))
        return self._cached[1]

    def batch(self, epoch, index):
        """(record indices, pad) of batch `index` of `epoch`."""
        positions = (index * self.batch_size + np.arange(self.batch_size)) * self.num_workers + self.rank
        pad = int((positions >= self.count).sum())
        return self.order(epoch)[positions % self.count], pad


class SequentialShard:
    """Validation: records [total*r//W, total*(r+1)//W) in file order (the split of shard_size); the last
    batch is filled with the shard's last record and its pad reported."""

    def __init__(self, total, rank, num_workers, batch_size):
        self.first, self.end = (total * rank) // num_workers, (total * (rank + 1)) // num_workers
        self.batch_size = batch_size
        self.real_samples = self.end - self.first
        self.num_batches = -(-self.real_samples // batch_size)

    def batch(self, epoch, index):
        positions = self.first + index * self.batch_size + np.arange(self.batch_size)
        return np.minimum(positions, self.end - 1), int((positions >= self.end).sum())


def shard_size(total, rank, num_workers):
    """Records in shard `rank` of the contiguous split: [total*r//W, total*(r+1)//W)."""
    return (total * (rank + 1)) // num_workers - (total * rank) // num_workers


def record_iter_part(total, rank, num_workers):
    """The records of part `rank` of ImageRecordIter's split (a range): chunks of ceil(total/W), the last one
    shorter."""
    step = -(-total // num_workers)
    return range(min(total, rank * step), min(total, (rank + 1) * step))


def drop_page_cache(path):
    """Evict the file at `path` from the page cache (posix_fadvise DONTNEED; pages a process maps stay): its next
    reads are cold, as on storage read for the first time (the loader benchmarks' measure of the reader)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
