"""Named training recipes as data: `--recipe NAME` sets the values of a published recipe; a flag given on the
command line wins over it, and the resolved values are logged and saved with the run like any other.

    ./runner -n 8 --recipe mlperf          # MLPerf's 8-GPU ResNet-50: -b 400, -l 0.88, LARS, poly decay, 37 epochs
    ./runner -n 8 --recipe mlperf -e 40    # the same with 40 epochs
    ./runner -n 8 --recipe torchvision-v2  # torchvision's 80.9% recipe: 600 epochs, TrivialAugment, EMA, 176/224
    ./runner -n 8 --recipe rsb-a3          # timm's ResNet strikes back A3: LAMB, BCE, RandAugment, 100 epochs

Each recipe gives train.py's flag values (`flags`), and the runner's per-GPU batch and learning rate per 256
images (`batch_per_gpu`, `lr_per_256`), which it turns into --batch-size and --lr for the global batch as for
any run. Sources: ../shared/reference/peer-recipes.md (D2, D3), MLPerf Training's NVIDIA MXNet submissions
(config_DGXH100.sh: LARS eta 0.001, momentum 0.9, 400 images per GPU, learning rate 11.0 at 3,200 images after 2
warm-up epochs, polynomial decay of power 2 to 0.0001 over 37 epochs, weight decay 5e-5, label smoothing 0.1,
evaluation every 4 epochs from epoch 2) and NVIDIA's DeepLearningExamples MXNet ResNet-50 README; torchvision's
blog "How to train state-of-the-art models using TorchVision's latest primitives" and its references/classification
README (the v2 command); Wightman et al. 2021, "ResNet strikes back" (arXiv 2110.00476), Table 1, procedure A3.
Where this recipe differs from theirs: torchvision warms up from 1% of the rate, here from 0; A3's RandAugment
draws its magnitude around 6 with a standard deviation of 0.5 (timm's mstd0.5), here always 6; A3's cosine
ends at 1e-6, here at 0. A3's LAMB is timm's (lamb.py).
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
    'torchvision-v2': {
        'about': "torchvision's 2021 recipe (ResNet50_Weights.IMAGENET1K_V2): 80.86% top-1 in 600 epochs",
        'batch_per_gpu': 128, 'lr_per_256': 0.125,     # 0.5 at 1,024 images (8 GPUs x 128)
        'flags': {'optimizer': 'sgd', 'mom': 0.9, 'num_epochs': 600, 'lr_schedule': 'cosine', 'warmup_epochs': 5.0,
                  'auto_augment': 'ta_wide', 'random_erase': 0.1, 'random_erase_mode': 'const',
                  'label_smoothing': 0.1, 'mixup': 0.2, 'cutmix': 1.0, 'wd': 2e-5,
                  'image_shape': (3, 176, 176), 'val_image_shape': (3, 224, 224), 'data_val_resize': 232,
                  'aug_repeats': 4, 'model_ema': True, 'model_ema_steps': 32, 'model_ema_decay': 0.99998,
                  'model_ema_adjust': True},
    },
    'rsb-a3': {
        'about': "timm's ResNet strikes back A3: 78.1% top-1 in 100 epochs, trained at 160 and tested at 224",
        'batch_per_gpu': 256, 'lr_per_256': 0.001,     # 8e-3 at 2,048 images (8 GPUs x 256)
        'flags': {'optimizer': 'lamb', 'wd': 0.02, 'num_epochs': 100, 'lr_schedule': 'cosine', 'warmup_epochs': 5.0,
                  'bce_loss': True, 'bce_target_thresh': 0.2, 'label_smoothing': 0.0, 'mixup': 0.1, 'cutmix': 1.0,
                  'auto_augment': 'ra', 'ra_magnitude': 6, 'ra_num_ops': 2,
                  'image_shape': (3, 160, 160), 'val_image_shape': (3, 224, 224), 'data_val_resize': 236},
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
