"""The network's settings as one record: what models.build makes (architecture, depth, groups, classes,
batchnorm, fused kernels, layouts, input shape, precision, stochastic depth, initialisation), the device aside.

    network = Network.of(args)                                # the composer, once, from the resolved flags
    net = models.build(network, world.devices.kind)           # the run's network on its devices
    teacher = dataclasses.replace(network, arch='resnetv15', num_layers=101, drop_path=0.0)   # another one
    Network(num_layers=18, num_classes=10)                    # by hand (tests, scripts): ResNet-18 v1.5

The defaults are ResNet-50 v1.5's, float32 and NCHW throughout; models.build checks the values (a RecipeError
for what the device or the installed MXNet cannot build).
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Network:
    """The Model flags, --dtype and the layouts as values (`of`): --arch (`arch`), --num-layers (`num_layers`,
    ResNet and ResNeXt), --num-classes, --num-groups (ResNeXt), --batchnorm-eps and --batchnorm-mom, whether
    the fused batchnorm kernels are asked for (`fuse_bn_relu`, `fuse_bn_add_relu`), the input, convolution,
    batchnorm and pooling layouts ('NCHW' or 'NHWC'), the input `image_shape` (C, H, W; C = 3, or 4 for a zero
    4th channel), the `dtype` ('float32' or 'float16'), stochastic depth (`drop_path`: 0 outside training),
    the initialisation (`init`, --init) and whether the last batchnorm of each residual unit starts at gamma 0
    (`zero_gamma`). The first fields keep models.get_model's order: get_model('resnetv1', 101) still works."""
    arch: str = 'resnetv15'
    num_layers: int = 50
    num_classes: int = 1000
    num_groups: int = 32
    batchnorm_eps: float = 1e-5
    batchnorm_mom: float = 0.9
    fuse_bn_relu: bool = False
    fuse_bn_add_relu: bool = False
    input_layout: str = 'NCHW'
    conv_layout: str = 'NCHW'
    batchnorm_layout: str = 'NCHW'
    pooling_layout: str = 'NCHW'
    image_shape: tuple = (3, 224, 224)
    dtype: str = 'float32'
    drop_path: float = 0.0
    init: str = 'nvidia'
    zero_gamma: bool = True

    # The fields that a resumed training run must keep (fit.RESUMED_SETTINGS, under the flags'
    # names): the others (kernels, layouts, initialisation) change how it runs, not what it learns.
    RESUMED = ('num_classes', 'arch', 'num_layers', 'image_shape', 'dtype', 'drop_path', 'batchnorm_eps',
               'batchnorm_mom', 'num_groups')

    @classmethod
    def of(cls, args):
        return cls(arch=args.arch, num_layers=args.num_layers, num_classes=args.num_classes,
                   num_groups=args.num_groups, batchnorm_eps=args.batchnorm_eps, batchnorm_mom=args.batchnorm_mom,
                   fuse_bn_relu=bool(args.fuse_bn_relu), fuse_bn_add_relu=bool(args.fuse_bn_add_relu),
                   input_layout=args.input_layout, conv_layout=args.conv_layout,
                   batchnorm_layout=args.batchnorm_layout, pooling_layout=args.pooling_layout,
                   image_shape=tuple(args.image_shape), dtype=args.dtype,
                   drop_path=args.drop_path if args.mode in ('train', 'train_val') else 0.0, init=args.init,
                   zero_gamma=bool(args.zero_gamma))
