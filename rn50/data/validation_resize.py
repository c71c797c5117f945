"""The validation resize, shared by validation, --mode pred and --mode export: ImageRecordIter's geometry
(shorter side to --data-val-resize, the longer rounded down, centre crop at floor offsets) with the run's
interpolation, and one image file prepared that way for prediction.
"""
import mxnet as mx

from rn50.data.contract import finish_images, image_shape
from rn50.errors import RecipeError, mxnet_message


def val_interpolation(args):
    """The validation resize's interpolation, a property of the run: the weights' run's in val, pred and export
    (args.val_interpolation, set by trained_settings), else the backend's: 'linear' (OpenCV's INTER_LINEAR, as
    ImageRecordIter) for mxnet, 'linear-antialias' (fn.resize's default) for DALI (and synthetic data's runs)."""
    if getattr(args, 'val_interpolation', None):
        return args.val_interpolation
    return 'linear' if args.data_backend == 'mxnet' else 'linear-antialias'


def describe_val_resize(args):
    """The log's words for what validation and pred do to an image (the geometry is ImageRecordIter's)."""
    return (f'shorter side to {args.data_val_resize} (the longer rounded down), {val_interpolation(args)} '
            'interpolation, centre %dx%d crop' % image_shape(args, training=False)[1:])


def load_image(path, args):
    """One image file as a network input batch of 1, preprocessed as ImageRecordIter validates ('linear': OpenCV
    decodes and resizes), normalised, in the layout, dtype and channels (dali.py predicts 'linear-antialias')."""
    try:
        with open(path, 'rb') as f:
            image = mx.image.imdecode(f.read(), to_rgb=1)
    except (OSError, mx.base.MXNetError) as e:
        raise RecipeError(f'cannot read image {path}: {mxnet_message(e)}') from e
    height, width = image_shape(args, training=False)[1:]
    image = mx.image.resize_short(image, args.data_val_resize, interp=1)   # ImageRecordIter's inter_method 1
    image, _ = mx.image.center_crop(image, (width, height))
    image = (image.astype('float32') - mx.nd.array(args.rgb_mean)) / mx.nd.array(args.rgb_std)
    return finish_images(mx.nd.transpose(image, axes=(2, 0, 1)).expand_dims(0), args)
