"""--mode pred: the top classes of an image or a folder of images, named, with the run's validation preprocessing;
and the class names every mode uses (--classes, the classes.json kept beside the weights, the data's, ImageNet's).

    ./runner --mode pred --workspace runs/demo --data-pred cat.jpg     # top 5, named by runs/demo/classes.json
    names = prediction.class_names_of(args)
    prediction.predict(net, world, prediction.Prediction.of(args), validation, images, workspace, dali.PredictionImages)
"""
import dataclasses
import logging
import os

import mxnet as mx
import numpy as np

from rn50 import files
from rn50.checkpoints import resume
from rn50.checkpoints.workspace import Workspace
from rn50.data import classes
from rn50.data.validation_resize import OpenCVImages, describe_val_resize
from rn50.errors import RecipeError
from rn50.inference.evaluation import logits

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp')


def prediction_inputs(path):
    """The image files --data-pred names: one file, or every image file of a folder and its subfolders
    (sorted by path)."""
    if path is None:
        raise RecipeError('--mode pred needs --data-pred IMAGE_OR_FOLDER')
    if os.path.isdir(path):
        files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names
                       if name.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise RecipeError(f'--data-pred {path}: no image files ({" ".join(IMAGE_SUFFIXES)}) in that folder '
                              'or its subfolders')
        return files
    if not os.path.exists(path):
        raise RecipeError(f'--data-pred {path}: no such file or folder')
    return [path]


def class_names(num_classes, classes_file=None, data_files=(), kept=None):
    """Names for the `num_classes` output classes: `classes_file` (--classes), else `kept` (the classes.json a
    training run keeps beside its weights, when it exists), else classes.json beside the training or validation
    data (`data_files`), else the ImageNet names for a 1000-class model, else "class N" (classes.py reads the
    files)."""
    if classes_file:
        return classes.read_names(classes_file, num_classes)
    if kept and os.path.isfile(kept):
        return classes.read_names(kept, num_classes, flag='the weights\' run\'s')
    path = classes.dataset_file(*data_files)
    if path:
        return classes.read_names(path, num_classes, flag='the dataset\'s')
    if num_classes == 1000:
        return classes.read_names(classes.IMAGENET_NAMES,
                                  1000, flag='the recipe\'s')
    return [f'class {i}' for i in range(num_classes)]


def class_names_of(args):
    """class_names of the resolved flags: --num-classes names from --classes; in val, pred and export the
    classes.json kept beside the weights (--load's, else the workspace's); else the data's classes.json (not for
    synthetic data, whose class count ignores it too), ..."""
    data_files = () if args.data_backend == 'synthetic' else (args.data_train, args.data_val)
    return class_names(args.num_classes, args.classes, data_files, kept_names(args))


def kept_names(args):
    """The classes.json beside the weights val, pred and export use (resume.find_weights), or None (training
    modes, which keep their own: fit.py; no weights)."""
    if args.mode not in ('val', 'pred', 'export'):
        return None
    try:
        weights = resume.find_weights(Workspace.of(args), args.load)
    except RecipeError:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(weights)), 'classes.json')


@dataclasses.dataclass(frozen=True)
class Prediction:
    """--mode pred's values (`of`): the image or folder to classify (`inputs`, --data-pred), how many classes to
    print (`topk`), the JSON file to write (`output`, --pred-output), the class `names` (class_names_of) and the
    --load whose name the JSON file records (`load`; else the workspace's weights)."""
    inputs: str
    names: tuple
    topk: int = 5
    output: str = None
    load: str = None

    @classmethod
    def of(cls, args):
        return cls(inputs=args.data_pred, names=tuple(class_names_of(args)), topk=args.topk, output=args.pred_output,
                   load=args.load)


def image_reader(images, dali_images):
    """The run's validation preprocessing for single images (`images`: its contract.Images), as pred and the review's
    worst images use it: load(path) and prepare(encoded bytes, name), each a normalised batch of 1 on the host.
    DALI's validation graph for a run that validates with DALI (`dali_images(images)`: dali.py's PredictionImages,
    given by the composer), else ImageRecordIter's (OpenCV)."""
    return dali_images(images) if images.val_interpolation == 'linear-antialias' else OpenCVImages(images)


def predict(net, world, prediction, validation, images, workspace, dali_images):
    """--mode pred (`prediction`, a Prediction): the top classes of each image, with probabilities, printed and
    optionally saved as JSON. An unreadable image is reported and the others are still classified. `net` comes
    from inference_network (trained weights, INT8 if asked), and computes as `validation` says (its --tta).
    Images are preprocessed as the run validates (image_reader: `images` is the run's contract.Images, `dali_images`
    dali.py's PredictionImages, given by the composer). `workspace`: the run's Workspace, whose weights the JSON file names."""
    names = prediction.names
    results = []
    inputs = prediction_inputs(prediction.inputs)
    # The run's validation preprocessing: DALI's graph for a run that validates with DALI, else ImageRecordIter's
    reader = image_reader(images, dali_images)
    log.info('Prediction with %s: %s', 'DALI (on the CPU)' if images.val_interpolation == 'linear-antialias' else
             'OpenCV', describe_val_resize(images))
    for path in inputs:
        try:
            image = reader.load(path).as_in_context(world.devices.contexts[0])
        except RecipeError as e:
            if len(inputs) > 1:   # one image alone: the error line at the end says it
                log.error('%s', e)
            results.append({'image': path, 'error': str(e)})
            continue
        probabilities = mx.nd.softmax(logits(validation, net, image).astype('float32')).asnumpy()[0]
        top = np.argsort(-probabilities)[:prediction.topk]
        print(f'{path}:')
        for rank, index in enumerate(top, 1):
            print(f'{rank:>3}. {probabilities[index] * 100:6.2f}% -> {names[index]}')
        results.append({'image': path, 'top': [{'class': int(i), 'name': names[i],
                                                 'probability': float(probabilities[i])} for i in top]})
    if prediction.output:
        weights = resume.find_weights(workspace, prediction.load)
        files.write_json(prediction.output, {'checkpoint': weights, 'trained': resume.describe_weights(weights).record(),
                                             'predictions': results})
    if all('error' in r for r in results):
        raise RecipeError(results[0]['error'] if len(results) == 1 else
                          f'none of the {len(results)} images of --data-pred {prediction.inputs} could be read '
                          f'(the first: {results[0]["error"]})')
    return results
