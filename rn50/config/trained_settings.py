"""What --mode val, pred and export take from the run that trained their weights (resume.inference_weights
chooses those): its network (--arch, --num-layers, --num-groups, --batchnorm-eps), image size, test image size
(--val-image-shape, which the command may change to test at another resolution, the resize following it),
validation resize and class count, so that a ResNet-18 trained at 128x128 is validated, asked and exported as
one, at 128x128, and one trained at 176 and tested at 224 at 224; asked to test at 64, that one resizes to 66
(the run's 232 at 224, same ratio) unless told another.

    values, source = trained_settings.taken_from_trained_run(args, given, num_classes_source)
    # resolve.for_run applies them

The training run records them in its state (`meta['settings']`, resume.run_settings). The weights
(resume.find_weights) name their run: a `.state` is its own run; a `<prefix>_*.params` file belongs to the
`<prefix>_last.state` beside it. A value the command gives that contradicts the run's is an error (as a used
workspace refuses another run's settings); foreign weights (GluonCV, torchvision, ...) and states written
before the settings were recorded inherit nothing. Layouts and precision are this machine's choice:
weight_loading.load_weights converts the weights to any of them.
"""
import logging
import os

from rn50.checkpoints import checkpoint
from rn50.checkpoints import resume
from rn50.checkpoints.workspace import Workspace
from rn50.errors import RecipeError

log = logging.getLogger(__name__)

INFERENCE_MODES = ('val', 'pred', 'export')


def source_state(weights):
    """The .state of the run that wrote `weights`, or None (foreign weights, or a file alone)."""
    if weights.endswith('.state'):
        return weights
    folder, name = os.path.split(os.path.abspath(weights))
    states = [entry for entry in sorted(os.listdir(folder)) if entry.endswith('_last.state')
              and name.startswith(entry[:-len('last.state')])]
    return os.path.join(folder, states[0]) if states else None


def another_test_size(args, settings, given):
    """--val-image-shape asking another test size than the run's (`settings`): the resize the command gives
    wins; else the run's resize follows by the same ratio (232 at 224 is 66 at 64), so that the crop is the
    same part of the image, never a patch of a resize meant for another size; logged. The resize for that
    size (given or derived), or None when the command tests at the run's size."""
    trained = tuple((settings.get('val_image_shape') or settings.get('image_shape') or (0, 0, 0))[1:])
    asked = tuple(args.val_image_shape[1:]) if 'val_image_shape' in given else trained
    if asked == trained or not settings.get('data_val_resize') or not all(trained):
        return None
    saved, what = settings['data_val_resize'], f'{asked[0]}x{asked[1]}'
    if 'data_val_resize' in given:
        log.info('Testing at %s (--val-image-shape), the run at %dx%d after resizing to %d: --data-val-resize %d '
                 '(given)', what, *trained, saved, args.data_val_resize)
        return args.data_val_resize
    resize = round(saved * max(asked) / max(trained))
    log.info('Testing at %s (--val-image-shape), the run at %dx%d after resizing to %d: --data-val-resize %d, '
             'the run\'s resize at the same ratio (give --data-val-resize for another)', what, *trained, saved,
             resize)
    return resize


def taken_from_trained_run(args, given, num_classes_source):
    """({flag destination: value} to take from the weights' run, where the class count now comes from): its
    --arch, --num-layers, --num-groups, --batchnorm-eps (the network's own: another epsilon would normalise
    every layer otherwise), --image-shape (height and width), --val-image-shape, --data-val-resize, class count and
    validation interpolation (`val_interpolation`: DALI and pred follow it, --data-backend mxnet cannot
    antialias; a 'linear' run validates with mxnet unless told another backend) where the command (`given`:
    the destinations it names) does not give them; RecipeError where it gives other values (but for
    --val-image-shape, and --data-val-resize with another test size: another_test_size). Nothing for training
    modes. rn50/config/resolve.py applies them; logged here, with the run they come from."""
    if args.mode not in INFERENCE_MODES:
        return {}, num_classes_source
    try:
        weights = resume.find_weights(Workspace.of(args), args.load)
    except RecipeError:   # no weights (a --no-metrics speed measurement): the mode says what it needs
        return {}, num_classes_source
    state = source_state(weights)
    settings = checkpoint.read_state(state).meta.get('settings') if state else None
    if not settings:
        return {}, num_classes_source
    values, taken, contradictions = {}, [], []

    def current(name):
        return values.get(name, getattr(args, name))

    if settings.get('image_shape'):
        height, width = settings['image_shape'][1:]
        if 'image_shape' in given and tuple(args.image_shape[1:]) != (height, width):
            contradictions.append(f'--image-shape {",".join(map(str, args.image_shape))} (trained at {height}x{width})')
        elif tuple(args.image_shape[1:]) != (height, width):
            values['image_shape'] = (args.image_shape[0], height, width)
            taken.append(f'--image-shape {",".join(map(str, values["image_shape"]))}')
    tested = settings.get('val_image_shape')     # the run's test resolution; --val-image-shape may ask another
    if tested and 'val_image_shape' not in given and tuple(args.val_image_shape or current('image_shape'))[1:] != \
            tuple(tested[1:]):
        values['val_image_shape'] = (current('image_shape')[0],) + tuple(tested[1:])
        taken.append(f'--val-image-shape {",".join(map(str, values["val_image_shape"]))}')
    resize = another_test_size(args, settings, given)
    if resize is not None and resize != args.data_val_resize:
        values['data_val_resize'] = resize
    for name in ('arch', 'num_layers', 'num_groups', 'batchnorm_eps', 'data_val_resize'):
        saved, flag = settings.get(name), '--' + name.replace('_', '-')
        if saved is None or getattr(args, name) == saved or (name == 'data_val_resize' and resize is not None):
            continue
        if name in given:
            contradictions.append(f'{flag} {getattr(args, name)} (trained with {saved})')
        else:
            values[name] = saved
            taken.append(f'{flag} {saved}')
    if settings.get('num_classes') is not None and args.num_classes != settings['num_classes']:
        if num_classes_source == 'the default':
            values['num_classes'], num_classes_source = settings['num_classes'], state
            taken.append(f'{values["num_classes"]} classes')
        else:
            contradictions.append(f'{args.num_classes} classes from {num_classes_source} (the model has '
                                  f'{settings["num_classes"]})')
    interpolation = settings.get('val_interpolation')   # how the run's validation resized
    if interpolation:
        values['val_interpolation'] = interpolation
        taken.append(f'its validation resize\'s {interpolation} interpolation')
        if interpolation == 'linear-antialias' and args.data_backend == 'mxnet':
            contradictions.append('--data-backend mxnet (the run validates with DALI\'s antialiased resize, which '
                                  'ImageRecordIter cannot do)')
        elif interpolation == 'linear' and args.data_backend is None:   # ImageRecordIter's, exactly
            values['data_backend'] = 'mxnet'
            taken.append('--data-backend mxnet (its validation backend: DALI would resize within a grey level)')
    if contradictions:
        raise RecipeError(f'{weights} was trained with other settings than this command gives: '
                          f'{"; ".join(contradictions)}. Leave those flags out: --mode {args.mode} takes them from '
                          f'the run ({state})')
    if taken:
        log.info('Taken from the run that trained %s (%s): %s', weights, state, ', '.join(taken))
    return values, num_classes_source
