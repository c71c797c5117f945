"""Data beyond data.py's flags and native loader: the contract every loader follows (contract), the
validation resize val, pred and export share (validation_resize), RecordIO files and the records each worker
reads (records), DALI's augmentations (augment), progressive resizing (resolution), synthetic batches
(synthetic) and class names (classes, imagenet_classes.txt).
"""
