"""Named training recipes as data: `--recipe NAME` sets the values of a published recipe; a flag given on the
command line wins over it, and the resolved values are logged and saved with the run like any other.

    ./runner -n 8 --recipe mlperf          # MLPerf's 8-GPU ResNet-50: -b 400, -l 0.88, LARS, poly decay, 37 epochs
    ./runner -n 8 --recipe mlperf -e 40    # the same with 40 epochs
    ./runner -n 8 --recipe torchvision-v2  # torchvision's 80.9% recipe: 600 epochs, TrivialAugment, EMA, 176/224
    ./runner -n 8 --recipe rsb-a3          # timm's ResNet strikes back A3: LAMB, BCE, RandAugment, 100 epochs

Each recipe gives train.py's flag values (`flags`), the runner's per-GPU batch (`batch_per_gpu`), and its
learning rate as its source states it: `lr` at `lr_batch` images per optimizer step, scaled to other batches
by `lr_scaling` (rn50/optim/schedule.py's scaled_lr: 'linear', or 'sqrt' as timm scales adaptive
optimizers); the runner's -l default is that rate at 256 images, and the runner and train.py scale it with the
recipe's rule and log which. Sizes keep the recipe's ratios (follow_sizes): `--recipe torchvision-v2
--image-shape 3,64,64` tests at 81 after an 84 resize, as 176 tests at 224 after 232. A recipe's warm-up is
shortened to half of a shorter run as the default one is (schedule.default_warmup).
Sources: MLPerf Training's NVIDIA MXNet submissions
(config_DGXH100.sh: LARS eta 0.001, momentum 0.9, 400 images per GPU, learning rate 11.0 at 3,200 images after 2
warm-up epochs, polynomial decay of power 2 to 0.0001 over 37 epochs, weight decay 5e-5, label smoothing 0.1,
evaluation every 4 epochs from epoch 2) and NVIDIA's DeepLearningExamples MXNet ResNet-50 README; torchvision's
blog "How to train state-of-the-art models using TorchVision's latest primitives" and its references/classification
README (the v2 command); Wightman et al. 2021, "ResNet strikes back" (arXiv 2110.00476), Table 1, procedure A3.
Where this recipe differs from theirs: torchvision warms up from 1% of the rate, here from 0; A3's cosine
ends at 1e-6, here at 0. A3's LAMB is timm's (lamb.py).

What each recipe takes from its source's code (issue 36; each checked in the source, and tested in
tests/test_recipes.py):
- mixup and CutMix: torchvision's RandomMixup/RandomCutmix and timm's Mixup (mode 'batch', its default) draw one
  lambda or box per batch: torchvision-v2 and rsb-a3 set --mixup-mode batch (the default, elem, keeps the
  original recipe's lambda per image).
- mlperf: MLPerf's reference (imagenet_preprocessing.py, area_range [0.05, 1]) and NVIDIA's run_and_time.sh crop at
  least 5% of the area (--min-random-area 0.05); NVIDIA's MLPerf MXNet train_imagenet.py initialises with
  MLPerfInit(rnd_type='gaussian', factor_type='in', magnitude=2): that Xavier for every weight (He-normal, as
  here), the classifier fc1 from N(0, 0.01) (--init mlperf), every batchnorm gamma 1 (its BNZeroInit, bn3 gamma
  0, is behind --bn-gamma-init0, which its run scripts do not pass: --zero-gamma 0).
- zero gamma: torchvision's resnet50() has zero_init_residual False and the v2 recipe does not set it
  (torchvision-v2: --zero-gamma 0); timm's ResNet has zero_init_last True (rsb-a3: 1, the default).
- torchvision's EMA (references/classification/train.py): after each update during the lr warm-up epochs it
  sets n_averaged to 0, so the next update copies the weights: --model-ema-adjust does the same (ema.py).
- timm's CosineLRScheduler (warmup_prefix False, t_initial = the epochs): the cosine runs over all the epochs and
  the warm-up replaces its start: rsb-a3 sets --warmup-prefix 0. Table 1's A3 has no stochastic depth (A1 and A2
  0.05, as mmpretrain's rsb-a1/a2 configurations set and its a3 does not): no --drop-path.
- timm's train.py, without --lr, scales --lr-base by the global batch over --lr-base-size, by the square root for
  optimizers named ada* or *lamb*: rsb-a3's 8e-3 at 2,048 images is 1e-3 at 32 images, not 1.25e-4.
- RandAugment: timm's rand-m6-mstd0.5-inc1 (timm/data/auto_augment.py) is magnitude 6 on its scale of 10
  (_LEVEL_DENOM: 60% of each operation's range), plus per application a normal noise of 0.5 clipped to [0, 10],
  each of 2 operations applied with probability 0.5 (AugmentOp's prob) and drawn from its 15
  _RAND_INCREASING_TRANSFORMS: rsb-a3 sets --ra-magnitude 6 --ra-magnitude-scale 10 --ra-magnitude-std 0.5
  --ra-prob 0.5 --ra-ops timm-increasing (it had bin 6 of 31, 20% of the range, both always applied, and
  torchvision's operations; tests/test_augment.py).
- fill: what a rotation, shear or translation uncovers is timm's img_mean, round(255 x (0.485, 0.456, 0.406)) =
  124,116,104 (rsb-a3: --auto-augment-fill 124,116,104), and 0 in torchvision (fill=None; the default, so
  torchvision-v2's); it was 128 for both.
Still different: timm's Equalize is PIL's (DALI's follows OpenCV's formula), its warps interpolate bilinearly or
bicubically at random (here bilinearly), and its Sharpness also sharpens the 1-pixel border;
torchvision's convolutions are He-normal of the fan-out and its classifier PyTorch's default
Linear initialisation; it updates its average at every 32nd batch of each epoch (here every 32nd step of the
run) and pairs image i with i - 1 (here with B-1-i, as timm); timm's warm-up starts at --warmup-lr and timm
changes the rate once per epoch (here every iteration).
"""
from rn50.optim import schedule

RECIPES = {
    'nvidia': {
        'about': "NVIDIA's DeepLearningExamples recipe, this recipe's defaults: SGD, cosine, 90 epochs; 77.2% top-1, "
                 '1.14 h on 8 A100 with AMP',
        'batch_per_gpu': 192, 'lr': 0.256, 'lr_batch': 256, 'lr_scaling': 'linear',
        'flags': {},
    },
    'mlperf': {
        'about': "MLPerf Training's NVIDIA MXNet ResNet-50 on one 8-GPU node: LARS, polynomial decay; the 75.9% target "
                 'in about 35 epochs, 13.3 min on 8 H100 (28.7 min on 8 A100); it stops there and writes the '
                 'MLPerf result log',
        'batch_per_gpu': 400, 'lr': 11.0, 'lr_batch': 3200, 'lr_scaling': 'linear',     # -l 0.88 per 256 images
        'flags': {'optimizer': 'lars', 'lars_eta': 0.001, 'mom': 0.9, 'wd': 5e-5, 'lr_schedule': 'poly',
                  'lr_poly_power': 2.0, 'end_lr': 0.0001, 'warmup_epochs': 2.0, 'num_epochs': 37,
                  'label_smoothing': 0.1, 'eval_period': 4, 'eval_offset': 2,
                  'min_random_area': 0.05, 'init': 'mlperf', 'zero_gamma': 0,
                  'target_accuracy': 0.759, 'mlperf_log': 'mlperf.log'},    # MLPerf's target; its result log
    },
    'torchvision-v2': {
        'about': "torchvision's 2021 recipe (ResNet50_Weights.IMAGENET1K_V2): 80.86% top-1 in 600 epochs",
        'batch_per_gpu': 128, 'lr': 0.5, 'lr_batch': 1024, 'lr_scaling': 'linear',      # -l 0.125 per 256 images
        'flags': {'optimizer': 'sgd', 'mom': 0.9, 'num_epochs': 600, 'lr_schedule': 'cosine', 'warmup_epochs': 5.0,
                  'auto_augment': 'ta_wide', 'random_erase': 0.1, 'random_erase_mode': 'const',
                  'label_smoothing': 0.1, 'mixup': 0.2, 'cutmix': 1.0, 'wd': 2e-5,
                  'image_shape': (3, 176, 176), 'val_image_shape': (3, 224, 224), 'data_val_resize': 232,
                  'aug_repeats': 4, 'model_ema': True, 'model_ema_steps': 32, 'model_ema_decay': 0.99998,
                  'model_ema_adjust': True,
                  'mixup_mode': 'batch', 'zero_gamma': 0},
    },
    'rsb-a3': {
        'about': "timm's ResNet strikes back A3: 78.1% top-1 in 100 epochs, trained at 160 and tested at 224",
        'batch_per_gpu': 256, 'lr': 8e-3, 'lr_batch': 2048, 'lr_scaling': 'sqrt',       # timm's rule for LAMB
        'flags': {'optimizer': 'lamb', 'wd': 0.02, 'num_epochs': 100, 'lr_schedule': 'cosine', 'warmup_epochs': 5.0,
                  'bce_loss': True, 'bce_target_thresh': 0.2, 'label_smoothing': 0.0, 'mixup': 0.1, 'cutmix': 1.0,
                  'auto_augment': 'ra', 'ra_magnitude': 6, 'ra_num_ops': 2,     # timm's rand-m6-mstd0.5-inc1
                  'ra_magnitude_scale': 10, 'ra_magnitude_std': 0.5, 'ra_prob': 0.5, 'ra_ops': 'timm-increasing',
                  'auto_augment_fill': (124, 116, 104),                     # timm's img_mean
                  'image_shape': (3, 160, 160), 'val_image_shape': (3, 224, 224), 'data_val_resize': 236,
                  'mixup_mode': 'batch', 'zero_gamma': 1, 'warmup_prefix': 0},
    },
}


def learning_rate(name, batch):
    """Recipe `name`'s learning rate at `batch` images per optimizer step (global batch x --grad-accum-steps)."""
    recipe = RECIPES[name]
    return schedule.scaled_lr(recipe['lr'], batch, recipe['lr_batch'], recipe['lr_scaling'])


def scaling(name):
    """How recipe `name` (None: the default, NVIDIA's) scales its learning rate with the batch: 'linear' or
    'sqrt'."""
    return RECIPES[name or 'nvidia']['lr_scaling']


def values(args, given):
    """{flag destination: value} of args.recipe for the flags the command line did not give (`given`: their
    destinations), the test size and resize following the command's sizes (follow_sizes); {} without a
    recipe. rn50/config/resolve.py applies them."""
    if args.recipe is None:
        return {}
    taken = {name: value for name, value in RECIPES[args.recipe]['flags'].items() if name not in given}
    return dict(taken, **follow_sizes(args, taken))


def follow_sizes(args, taken):
    """A recipe that trains at one size and tests at another after a resize (torchvision-v2: 176, 224 after
    232) keeps its ratios at the sizes the command gives: a --val-image-shape the command left to the recipe
    (`taken`: what the recipe sets) is the training size times test/train (64 -> 81), a --data-val-resize left
    to it is the test size times resize/test (81 -> 84), so that no other training size tests a patch of a
    232-pixel image. {destination: value} of the derived ones."""
    recipe = RECIPES[args.recipe]['flags']
    if 'val_image_shape' not in recipe:
        return {}
    train, test, resize = recipe['image_shape'][1:], recipe['val_image_shape'][1:], recipe['data_val_resize']
    image_shape = taken.get('image_shape', args.image_shape)
    derived = {}
    if 'val_image_shape' in taken:
        derived['val_image_shape'] = (recipe['val_image_shape'][0],) + tuple(
            round(side * new / old) for side, new, old in zip(test, image_shape[1:], train))
    if 'data_val_resize' in taken:
        val_image_shape = derived.get('val_image_shape', args.val_image_shape)
        derived['data_val_resize'] = round(resize * max(val_image_shape[1:]) / max(test))
    return derived


def size_words(args, from_recipe):
    """The log's words for the test size and resize follow_sizes derived from the command's sizes, or None
    (the recipe's own, or given). `from_recipe`: the destinations the recipe set."""
    recipe = RECIPES[args.recipe]['flags'] if args.recipe else {}
    derived = [name for name in ('val_image_shape', 'data_val_resize') if name in recipe and
               name in from_recipe and getattr(args, name) != recipe[name]]
    if not derived:
        return None
    train, test = (f'{shape[1]}x{shape[2]}' for shape in (recipe['image_shape'], recipe['val_image_shape']))
    now_train, now_test = (f'{shape[1]}x{shape[2]}' for shape in (args.image_shape, args.val_image_shape))
    what = {'val_image_shape': '--val-image-shape', 'data_val_resize': '--data-val-resize'}
    return (f'Recipe {args.recipe} trains at {train} and tests at {test} after resizing to '
            f'{recipe["data_val_resize"]}; this run trains at {now_train} and tests at {now_test} after resizing to '
            f'{args.data_val_resize}, the recipe\'s ratios ({" and ".join(what[name] for name in derived)} not '
            'given)')
