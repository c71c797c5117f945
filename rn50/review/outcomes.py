"""Every validation image's outcome, gathered from every worker, and the figures drawn from them: per-class
precision, recall, F1, support, top-1 and top-5, the confusion counts, the most-confused pairs, the worst images
(highest loss) and the calibration (expected calibration error, reliability bins, the confidence at which the
model is right 95% of the time). numpy only: no MXNet, no pictures.

    table = OutcomeTable(num_images)                       # evaluation.validate fills it during a pass
    table.add(record_indices, labels, log_probabilities)   # a batch's real images (padding removed)
    table = table.gathered(world.comm)                     # every worker's rows, each image once
    figures = review_figures(table, names, worst=16)       # report.json's "review"

A row per validation record (its position in the .idx, which every worker's shard keeps), so that N workers
give the same table as one: the rows are summed over the workers and each image must have been seen exactly once
(`--dali-separ-val` has every worker see every image: each row is then the mean of identical copies).
"""
import numpy as np

from rn50.errors import RecipeError

# The columns of a row: the true class, the top-1 class, its probability, the true class's probability, the
# image's cross-entropy loss (-log of the true class's probability, from log-softmax), the true class's rank
# among the outputs (0: top-1), and how many times a pass saw the image (1 after gathering).
FIELDS = ('label', 'predicted', 'confidence', 'true_probability', 'loss', 'true_rank', 'seen')
COLUMN = {name: i for i, name in enumerate(FIELDS)}
CALIBRATION_BINS = 15
TRUSTED_ACCURACY = 0.95
MOST_CONFUSED = 20


class OutcomeTable:
    """The outcomes of a validation pass, a row per record of the validation set (`num_images` of them); rows of
    records this worker did not see stay zero until `gathered` sums them over the workers."""

    def __init__(self, num_images, rows=None):
        self.rows = np.zeros((num_images, len(FIELDS))) if rows is None else rows

    def __len__(self):
        return len(self.rows)

    def column(self, name):
        return self.rows[:, COLUMN[name]]

    def add(self, indices, labels, log_probabilities):
        """The outcomes of images `indices` (record positions) with true `labels` from the network's
        `log_probabilities` (log-softmax of the outputs, (images, classes))."""
        indices = np.asarray(indices, np.int64)
        labels = np.asarray(labels, np.int64)
        log_probabilities = np.asarray(log_probabilities, np.float64)
        rows = np.arange(len(indices))
        true = log_probabilities[rows, labels]
        predicted = log_probabilities.argmax(axis=1)
        rank = (log_probabilities > true[:, None]).sum(axis=1)
        self.rows[indices] += np.stack([labels, predicted, np.exp(log_probabilities[rows, predicted]), np.exp(true),
                                        -true, rank, np.ones(len(indices))], axis=1)

    def gathered(self, comm):
        """The table of every worker (`comm`: the world's Communicator), each image's row once: RecipeError when
        a pass missed an image (a loader's shards must cover the set) or saw copies that disagree."""
        total = comm.allreduce_sum(self.rows.ravel()).reshape(self.rows.shape)
        seen = total[:, COLUMN['seen']]
        if (seen == 0).any():
            missing = np.flatnonzero(seen == 0)
            raise RecipeError(f'the validation pass saw no outcome for {len(missing)} of {len(seen)} images (first: '
                              f'record {int(missing[0])}): the loaders\' shards do not cover the validation set')
        rows = total / seen[:, None]
        if (seen > 1).any() and not np.allclose(rows[:, COLUMN['label']], np.round(rows[:, COLUMN['label']])):
            raise RecipeError('the workers saw different labels for the same validation record')
        return OutcomeTable(len(rows), rows)


def confusion_counts(labels, predicted, num_classes):
    """(num_classes, num_classes) counts: row = true class, column = the top-1 class."""
    cells = labels.astype(np.int64) * num_classes + predicted.astype(np.int64)
    return np.bincount(cells, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def per_class(confusion, true_rank, labels):
    """A dict per class: precision, recall, F1 and support from the `confusion` counts; top-1 (the class's
    images whose top-1 class is right: its recall) and top-5 (from the true class's rank) over its images."""
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    right = np.diag(confusion)
    precision = np.divide(right, predicted, out=np.zeros(len(right)), where=predicted > 0)
    recall = np.divide(right, support, out=np.zeros(len(right)), where=support > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(len(right)),
                   where=precision + recall > 0)
    top5 = np.bincount(labels.astype(np.int64), weights=true_rank < 5, minlength=len(right))
    top5 = np.divide(top5, support, out=np.zeros(len(right)), where=support > 0)
    return [{'class': c, 'precision': float(precision[c]), 'recall': float(recall[c]), 'f1': float(f1[c]),
             'support': int(support[c]), 'top1': float(recall[c]), 'top5': float(top5[c])} for c in range(len(right))]


def most_confused(confusion, count=MOST_CONFUSED):
    """The `count` largest off-diagonal cells of `confusion`: (true class, top-1 class, images), largest first,
    ties in class order."""
    off = confusion.copy()
    np.fill_diagonal(off, 0)
    cells = np.flatnonzero(off)
    cells = cells[np.lexsort((cells, -off.ravel()[cells]))][:count]
    return [(int(c // len(off)), int(c % len(off)), int(off.ravel()[c])) for c in cells]


def calibration(confidence, correct, bins=CALIBRATION_BINS, trusted=TRUSTED_ACCURACY):
    """How far the top-1 probability is from the accuracy: the expected calibration error over `bins` equal-width
    bins of confidence, (lower, upper] as Guo et al. 2017 define them (the images' share in each bin times
    |accuracy - mean confidence| there, summed), the bins
    themselves (the reliability diagram), and the lowest confidence at which the images at or above it are right
    `trusted` of the time (None: never, not even the most confident image), with the share of images there."""
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.searchsorted(edges, confidence, side='left') - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    mean_confidence = np.bincount(which, weights=confidence, minlength=bins) / np.maximum(count, 1)
    accuracy = np.bincount(which, weights=correct, minlength=bins) / np.maximum(count, 1)
    ece = float(np.sum(count / max(len(confidence), 1) * np.abs(accuracy - mean_confidence)))
    reliability = [{'lower': float(edges[b]), 'upper': float(edges[b + 1]), 'images': int(count[b]),
                    'confidence': float(mean_confidence[b]) if count[b] else None,
                    'accuracy': float(accuracy[b]) if count[b] else None} for b in range(bins)]
    order = np.argsort(-confidence, kind='stable')
    ranked, right = confidence[order], np.cumsum(correct[order])
    # a threshold keeps every image of its confidence: only the last of equal confidences is a cut
    cuts = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True))
    good = cuts[right[cuts] / (cuts + 1) >= trusted]
    threshold = None
    if len(good):
        last = good[-1]
        threshold = {'confidence': float(ranked[last]), 'images': int(last + 1),
                     'share': float((last + 1) / len(confidence)), 'accuracy': float(right[last] / (last + 1))}
    return {'bins': bins, 'ece': ece, 'reliability': reliability, 'target_accuracy': trusted,
            'trusted_from': threshold}


def worst(table, count):
    """The record positions of the `count` images of highest loss, highest first (ties: lower position)."""
    loss = table.column('loss')
    return [int(i) for i in np.lexsort((np.arange(len(loss)), -loss))[:count]]


def review_figures(table, names, worst_count=16):
    """report.json's "review" of a gathered `table` with class `names`: the figures above as plain values (the
    worst images as record positions with their outcome; the caller adds what it knows of their files)."""
    labels, predicted = table.column('label'), table.column('predicted')
    confusion = confusion_counts(labels, predicted, len(names))
    classes = per_class(confusion, table.column('true_rank'), labels)
    for entry in classes:
        entry['name'] = names[entry['class']]
    correct = (labels == predicted).astype(np.float64)
    nonzero = np.argwhere(confusion)
    return {
        'images': len(table), 'num_classes': len(names),
        'top1': float(correct.mean()), 'top5': float((table.column('true_rank') < 5).mean()),
        'loss': float(table.column('loss').mean()),
        'per_class': classes,
        'confusion': [[int(t), int(p), int(confusion[t, p])] for t, p in nonzero],
        'most_confused': [{'true': t, 'true_name': names[t], 'predicted': p, 'predicted_name': names[p],
                           'images': n} for t, p, n in most_confused(confusion)],
        'calibration': calibration(table.column('confidence'), correct),
        'worst': [dict(record=i, **outcome(table, i, names)) for i in worst(table, worst_count)],
    }


def outcome(table, index, names):
    """Record `index`'s outcome, named: true and predicted class with their probabilities, and its loss."""
    row = table.rows[index]
    true, predicted = int(row[COLUMN['label']]), int(row[COLUMN['predicted']])
    return {'true': true, 'true_name': names[true], 'true_probability': float(row[COLUMN['true_probability']]),
            'predicted': predicted, 'predicted_name': names[predicted],
            'predicted_probability': float(row[COLUMN['confidence']]), 'loss': float(row[COLUMN['loss']])}


def confusion_matrix(review):
    """The dense counts (rows: true class, columns: top-1 class) of a review's sparse "confusion" triples."""
    matrix = np.zeros((review['num_classes'],) * 2, np.int64)
    for true, predicted, images in review['confusion']:
        matrix[true, predicted] = images
    return matrix
