"""Data beyond data.py's flags and native loader: the contract every loader follows and the records a loader is
given (contract: Dataset, Images), the training augmentation stated once (preset: TrainingPreset), the
validation resize val, pred and export share (validation_resize), RecordIO files and the records each worker
reads (records), the random-resized-crop windows of DALI's pipeline drawn in numpy (crop_windows), DALI's
automatic augmentation and erasing (augment), progressive resizing (resolution), synthetic batches (synthetic)
and class names (classes, imagenet_classes.txt).
"""
