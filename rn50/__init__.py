"""The recipe's package: everything but the entry points at the repository root (train.py composes, fit.py
trains, data.py and dali.py load, models.py builds the networks, runner and benchmark.py launch), one folder
per concern. Code here never imports a root module; the root passes in what it needs (tests/test_layout.py).

    launch/       starting the project's Python, supervising horovodrun, stopping on a signal
    world/        the worker world, devices, precision, seeds; this CPU; will the batch fit
    config/       flag value types, named recipes, the trained run's settings
    data/         the loader contract, RecordIO records, augmentation, resizing, synthetic data, class names
    nets/         the layers and Builder every network is made of, the catalogue of architectures
    optim/        the learning-rate schedule, LARS and LAMB
    training/     the step, losses and targets, EMA, distillation and the other training extras
    checkpoints/  the recipe's checkpoint files, the optimizer state, weights of other origins
    inference/    validation, --mode val and pred, INT8, --mode export (MXNet, ONNX, PyTorch, Triton)
    reports/      the human log, DLLogger, report.json, TensorBoard, MLPerf's result log
"""
