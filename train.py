"""Entry point: parse the flags, build the model and the data, hand both to fit.py.

Use it through the runner, which turns per-device batch and LR into global values and starts one Horovod
worker per device:

    ./runner -n 8 -b 192                                    # ImageNet, 8 GPUs, float16
    ./runner -n 1 -b 32 --dtype float32 --data-root data/demo -e 10 --image-shape 3,32,32

or directly, with global values:

    python train.py --data-train data/demo/train.rec --data-train-idx data/demo/train.idx \\
        --data-val data/demo/val.rec --data-val-idx data/demo/val.idx --batch-size 32 --lr 0.032 \\
        --num-epochs 10 --image-shape 3,32,32 --num-classes 10 --workspace runs/demo

`python train.py --help` lists every flag, grouped as Model, Training, Data, DALI, MXNet augmentation and
Inference.
A problem the user can fix (bad flags, missing files, no GPU for a GPU-only request) is printed as
`error: ...` without a traceback, exit status 2.
"""
import argparse
import logging
import os
import sys

import dali
import data
import fit
import inference
import logs
import models
from errors import RecipeError


def build_parser():
    parser = argparse.ArgumentParser(description='Train, validate or run ResNet-50 v1.5 and relatives',
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    models.add_model_args(parser)
    fit.add_fit_args(parser)
    data.add_data_args(parser)
    dali.add_dali_args(parser)
    data.add_data_aug_args(parser)
    inference.add_inference_args(parser)
    return parser


def in_workspace(args, path):
    return path if os.path.isabs(path) else os.path.join(args.workspace, path)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        world = fit.World(args.kv_store)
        logs.setup_logging(in_workspace(args, args.log), world.rank)
        fit.resolve_hardware(args, world)
        data.resolve_backend(args)
        inference.check_inference_flags(args)
        net = models.get_model(**models.model_options(args))
        fit.fit(args, net, world, data.get_loaders)
    except RecipeError as e:
        logging.getLogger(__name__).debug('RecipeError', exc_info=True)
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
