"""Knowledge distillation (--teacher): the student learns from a trained network's softened outputs as well as
from the labels.

    ./runner -n 8 --teacher runs/resnet152/model_best.params --teacher-num-layers 152 --kd-alpha 0.5 ...
    python train.py --teacher resnet101.safetensors --teacher-num-layers 101 --kd-temperature 4 ...

The teacher is any weights the recipe loads (its own runs, the original recipe's, GluonCV's, torchvision's or
timm's; weight_loading.load_weights converts them), built as --teacher-arch / --teacher-num-layers (default: the
student's) with the run's layouts and precision, and runs forward only, in inference mode (batchnorm's running
statistics), on the same augmented images as the student (after mixup or CutMix). Per image the loss is

    (1 - alpha) x loss(student, targets) + alpha x T^2 x KL(softmax(teacher / T) || softmax(student / T))

with alpha --kd-alpha and T --kd-temperature (Hinton et al., 2015: T^2 keeps the soft term's gradients at the
scale of the hard one's).
"""
import dataclasses
import logging

import mxnet as mx
from mxnet import autograd

from rn50.checkpoints import weight_loading
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


@dataclasses.dataclass(frozen=True)
class Distillation:
    """--teacher and its options as values (`of`: None without --teacher): the teacher's `weights`, its `arch` and
    `num_layers` (default: the student's), the `alpha` and `temperature` of the loss, the run's `num_classes`
    and input normalisation (`mean`, `std`: what the weights are compared with when loaded)."""
    weights: str
    arch: str
    num_layers: int
    alpha: float = 0.5
    temperature: float = 1.0
    num_classes: int = 1000
    mean: tuple = (123.68, 116.779, 103.939)
    std: tuple = (58.393, 57.12, 57.375)

    @classmethod
    def of(cls, args):
        if not args.teacher:
            return None
        return cls(weights=args.teacher, arch=args.teacher_arch or args.arch,
                   num_layers=args.teacher_num_layers or args.num_layers, alpha=args.kd_alpha,
                   temperature=args.kd_temperature, num_classes=args.num_classes, mean=tuple(args.rgb_mean),
                   std=tuple(args.rgb_std))


class Teacher:
    """The teacher network on the worker's devices, with its weights, forward only."""

    def __init__(self, distillation, network, build_network, contexts):
        """`distillation`: a Distillation; `network`: the student's nets.network.Network, which the teacher's is
        but for its architecture and depth, without stochastic depth; `build_network(network)`: the composer's
        models.build on the worker's kind of device; `contexts`: the worker's devices."""
        teacher = dataclasses.replace(network, arch=distillation.arch, num_layers=distillation.num_layers,
                                      drop_path=0.0)
        self.net = build_network(teacher)
        self.net.initialize(ctx=list(contexts))
        try:
            weight_loading.load_weights(self.net, distillation.weights, distillation.mean, distillation.std)
        except (RecipeError, ValueError, KeyError) as e:
            raise RecipeError(f'--teacher {distillation.weights}: these weights are not a {teacher.arch} of '
                              f'{teacher.num_layers} layers with {distillation.num_classes} classes ({e}); give '
                              '--teacher-arch and --teacher-num-layers') from e
        self.net.collect_params().setattr('grad_req', 'null')
        self.net.hybridize(static_alloc=True, static_shape=True)
        self.temperature, self.alpha = distillation.temperature, distillation.alpha
        log.info('Distilling from %s (%s, %d layers): alpha %g, temperature %g', distillation.weights,
                 teacher.arch, teacher.num_layers, self.alpha, self.temperature)

    def loss(self, images, student_logits, label_loss):
        """Per-image loss: (1 - alpha) x `label_loss` + alpha x T^2 x KL(teacher || student) at temperature T."""
        with autograd.pause(train_mode=False):
            teacher = mx.nd.log_softmax(self.net(images).astype('float32') / self.temperature, axis=1)
        student = mx.nd.log_softmax(student_logits.astype('float32') / self.temperature, axis=1)
        divergence = mx.nd.sum(mx.nd.exp(teacher) * (teacher - student), axis=1)
        return (1 - self.alpha) * label_loss + self.alpha * self.temperature ** 2 * divergence
