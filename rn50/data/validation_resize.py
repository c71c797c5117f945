"""The validation geometry, one rule for validation, --mode pred, --mode export and Triton's pipeline: ImageRecordIter's
(the shorter side to --data-val-resize, the longer to floor(longer x resize / shorter) in integers, the centre crop
at floor offsets) with the run's interpolation; and one image file prepared that way for prediction. `images`: the
run's contract.Images (its validation size, resize, interpolation, normalisation, layout and dtype).

    rows, columns = resized_size(height, width, images.val_resize)    # numbers, or DALI's DataNodes (dali.py)
    top, left = crop_start(rows, height_crop), crop_start(columns, width_crop)
    steps = geometry_steps(images)                                   # the words of model.preprocessing.json

ImageRecordIter (--data-backend mxnet) computes the same in C++ from its `resize` parameter; the tests hold it to
this rule (tests/test_preprocessing.py).
"""
import mxnet as mx

from rn50.data.contract import finish_images
from rn50.errors import RecipeError, mxnet_message


def resized_size(height, width, resize, minimum=min):
    """(rows, columns) of a `height` x `width` image after the validation resize: the shorter side to `resize`, the
    longer to floor(longer x resize / shorter), in integers as ImageRecordIter. Numbers, or DALI's DataNodes
    (`minimum`: nvidia.dali.math.min)."""
    shorter = minimum(height, width)
    return height * resize // shorter, width * resize // shorter


def crop_start(resized, crop):
    """The first row (or column) of the centre crop of `crop` pixels out of `resized`: floor((resized - crop) / 2)."""
    return (resized - crop) // 2


def geometry_steps(images):
    """The resize and the crop in words (what export writes into model.preprocessing.json's steps)."""
    height, width = images.shape_of(training=False)[1:]
    return [f'resize the shorter side to {images.val_resize} and the longer to floor(longer * {images.val_resize} / '
            f'shorter), linear interpolation, {FILTER_WORDS[images.val_interpolation]}',
            f'crop the centre {height}x{width} (H x W) at offsets floor((resized - crop) / 2)']


FILTER_WORDS = {
    'linear-antialias': 'antialiased when shrinking (Pillow: image.resize(size, Image.BILINEAR))',
    'linear': 'no antialiasing (OpenCV: cv2.resize(image, size, interpolation=cv2.INTER_LINEAR); Pillow: '
              'image.transform(size, Image.AFFINE, (image.width / size[0], 0, 0, 0, image.height / size[1], 0), '
              'Image.BILINEAR))'}


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
    rows, columns = resized_size(image.shape[0], image.shape[1], images.val_resize)
    image = mx.image.imresize(image, columns, rows, interp=1)   # ImageRecordIter's inter_method 1: bilinear
    top, left = crop_start(rows, height), crop_start(columns, width)
    image = image[top:top + height, left:left + width]
    image = (image.astype('float32') - mx.nd.array(images.mean)) / mx.nd.array(images.std)
    return finish_images(mx.nd.transpose(image, axes=(2, 0, 1)).expand_dims(0), images)
