"""Knowledge distillation (--teacher): the student learns from a trained network's softened outputs as well as
from the labels.

    ./runner -n 8 --teacher runs/resnet152/model_best.params --teacher-num-layers 152 --kd-alpha 0.5 ...
    python train.py --teacher resnet101.safetensors --teacher-num-layers 101 --kd-temperature 4 ...

The teacher is any weights the recipe loads (its own runs, the original recipe's, GluonCV's, torchvision's or
timm's; weight_files.load_weights converts them), built as --teacher-arch / --teacher-num-layers (default: the
student's) with the run's layouts and precision, and runs forward only, in inference mode (batchnorm's running
statistics), on the same augmented images as the student (after mixup or CutMix). Per image the loss is

    (1 - alpha) x loss(student, targets) + alpha x T^2 x KL(softmax(teacher / T) || softmax(student / T))

with alpha --kd-alpha and T --kd-temperature (Hinton et al., 2015: T^2 keeps the soft term's gradients at the
scale of the hard one's).
"""
import logging

import mxnet as mx
from mxnet import autograd

from rn50.checkpoints import weight_files
from rn50 import flags
from rn50.errors import RecipeError
from rn50.nets.catalogue import ARCHITECTURES

log = logging.getLogger(__name__)


def add_args(group):
    """The flags, in fit.py's Training group."""
    group.add_argument('--teacher', default=None, metavar='WEIGHTS',
                       help='distil from this trained network (any weights --load takes)')
    group.add_argument('--teacher-arch', default=None, choices=ARCHITECTURES,
                       help='--teacher: its architecture (default: --arch)')
    group.add_argument('--teacher-num-layers', type=flags.integer(minimum=1), default=None,
                       help='--teacher: its depth (default: --num-layers)')
    group.add_argument('--kd-temperature', type=flags.real(minimum=0, exclusive=True), default=1.0,
                       help='--teacher: the temperature T that softens both networks\' outputs')
    group.add_argument('--kd-alpha', type=flags.real(minimum=0, maximum=1), default=0.5,
                       help='--teacher: the weight of the distillation term (1 - alpha: the labels\')')


class Teacher:
    """The teacher network on the worker's devices, with its weights, forward only."""

    def __init__(self, args, build_network, contexts):
        """`build_network(**overrides)`: the composer's models.build for the parsed flags; `contexts`: the
        worker's devices."""
        options = dict(arch=args.teacher_arch or args.arch, num_layers=args.teacher_num_layers or args.num_layers,
                       drop_path=0.0)
        self.net = build_network(**options)
        self.net.initialize(ctx=list(contexts))
        try:
            weight_files.load_weights(self.net, args.teacher, args.rgb_mean, args.rgb_std)
        except (RecipeError, ValueError, KeyError) as e:
            raise RecipeError(f'--teacher {args.teacher}: these weights are not a {options["arch"]} of '
                              f'{options["num_layers"]} layers with {args.num_classes} classes ({e}); give '
                              '--teacher-arch and --teacher-num-layers') from e
        self.net.collect_params().setattr('grad_req', 'null')
        self.net.hybridize(static_alloc=True, static_shape=True)
        self.temperature, self.alpha = args.kd_temperature, args.kd_alpha
        log.info('Distilling from %s (%s, %d layers): alpha %g, temperature %g', args.teacher, options['arch'],
                 options['num_layers'], self.alpha, self.temperature)

    def loss(self, images, student_logits, label_loss):
        """Per-image loss: (1 - alpha) x `label_loss` + alpha x T^2 x KL(teacher || student) at temperature T."""
        with autograd.pause(train_mode=False):
            teacher = mx.nd.log_softmax(self.net(images).astype('float32') / self.temperature, axis=1)
        student = mx.nd.log_softmax(student_logits.astype('float32') / self.temperature, axis=1)
        divergence = mx.nd.sum(mx.nd.exp(teacher) * (teacher - student), axis=1)
        return (1 - self.alpha) * label_loss + self.alpha * self.temperature ** 2 * divergence
