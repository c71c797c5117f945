"""The validation resize, shared by validation, --mode pred and --mode export: ImageRecordIter's geometry
(shorter side to --data-val-resize, the longer rounded down, centre crop at floor offsets) with the run's
interpolation, and one image file prepared that way for prediction. `images`: the run's contract.Images (its
validation size, resize, interpolation, normalisation, layout and dtype).
"""
import mxnet as mx

from rn50.data.contract import finish_images
from rn50.errors import RecipeError, mxnet_message


def describe_val_resize(images):
    """The log's words for what validation and pred do to an image (the geometry is ImageRecordIter's)."""
    return (f'shorter side to {images.val_resize} (the longer rounded down), {images.val_interpolation} '
            'interpolation, centre %dx%d crop' % images.shape_of(training=False)[1:])


class OpenCVImages:
    """pred's input for a run that validates as ImageRecordIter ('linear'): load(path) and prepare(encoded, name)
    as load_image and prepare_image (dali.py's PredictionImages has the same two for 'linear-antialias')."""

    def __init__(self, images):
        self.images = images

    def load(self, path):
        return load_image(path, self.images)

    def prepare(self, encoded, name):
        return prepare_image(encoded, self.images, name)


def load_image(path, images):
    """One image file as a network input batch of 1, preprocessed as ImageRecordIter validates ('linear': OpenCV
    decodes and resizes), normalised, in the layout, dtype and channels of `images` (dali.py predicts
    'linear-antialias')."""
    try:
        with open(path, 'rb') as f:
            encoded = f.read()
    except OSError as e:
        raise RecipeError(f'cannot read image {path}: {e.strerror or e}') from e
    return prepare_image(encoded, images, path)


def prepare_image(encoded, images, name):
    """load_image's preprocessing of an encoded image (`encoded`: its bytes; `name`: what an error calls it)."""
    try:
        image = mx.image.imdecode(encoded, to_rgb=1)
    except mx.base.MXNetError as e:
        raise RecipeError(f'cannot read image {name}: {mxnet_message(e)}') from e
    height, width = images.shape_of(training=False)[1:]
    image = mx.image.resize_short(image, images.val_resize, interp=1)   # ImageRecordIter's inter_method 1
    image, _ = mx.image.center_crop(image, (width, height))
    image = (image.astype('float32') - mx.nd.array(images.mean)) / mx.nd.array(images.std)
    return finish_images(mx.nd.transpose(image, axes=(2, 0, 1)).expand_dims(0), images)
