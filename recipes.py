"""Named training recipes as data: `--recipe NAME` sets the values of a published recipe; a flag given on the
command line wins over it, and the resolved values are logged and saved with the run like any other.

    ./runner -n 8 --recipe mlperf          # MLPerf's 8-GPU ResNet-50: -b 400, -l 0.88, LARS, poly decay, 37 epochs
    ./runner -n 8 --recipe mlperf -e 40    # the same with 40 epochs

Each recipe gives train.py's flag values (`flags`), and the runner's per-GPU batch and learning rate per 256
images (`batch_per_gpu`, `lr_per_256`), which it turns into --batch-size and --lr for the global batch as for
any run. Sources: ../shared/reference/peer-recipes.md (D2, D3), MLPerf Training's NVIDIA MXNet submissions
(config_DGXH100.sh: LARS eta 0.001, momentum 0.9, 400 images per GPU, learning rate 11.0 at 3,200 images after 2
warm-up epochs, polynomial decay of power 2 to 0.0001 over 37 epochs, weight decay 5e-5, label smoothing 0.1,
evaluation every 4 epochs from epoch 2) and NVIDIA's DeepLearningExamples MXNet ResNet-50 README.
"""

RECIPES = {
    'nvidia': {
        'about': "NVIDIA's DeepLearningExamples recipe, this recipe's defaults: SGD, cosine, 90 epochs; 77.2% top-1, "
                 '1.14 h on 8 A100 with AMP',
        'batch_per_gpu': 192, 'lr_per_256': 0.256,
        'flags': {},
    },
    'mlperf': {
        'about': "MLPerf Training's NVIDIA MXNet ResNet-50 on one 8-GPU node: LARS, polynomial decay; the 75.9% target "
                 'in about 35 epochs, 13.3 min on 8 H100 (28.7 min on 8 A100)',
        'batch_per_gpu': 400, 'lr_per_256': 0.88,      # 11.0 at 3,200 images
        'flags': {'optimizer': 'lars', 'lars_eta': 0.001, 'mom': 0.9, 'wd': 5e-5, 'lr_schedule': 'poly',
                  'lr_poly_power': 2.0, 'end_lr': 0.0001, 'warmup_epochs': 2.0, 'num_epochs': 37,
                  'label_smoothing': 0.1, 'eval_period': 4, 'eval_offset': 2},
    },
}


def apply(args, given):
    """Set the flags of args.recipe that the command line did not give (`given`: their destinations); returns
    the names set, for the log."""
    if args.recipe is None:
        return []
    taken = [name for name in RECIPES[args.recipe]['flags'] if name not in given]
    for name in taken:
        setattr(args, name, RECIPES[args.recipe]['flags'][name])
    return taken
