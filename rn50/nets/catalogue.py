"""Which networks the recipe builds (models.py builds them): the architectures --arch names and the ResNet
depths --num-layers takes, which the readers of foreign weights (rn50/checkpoints/weight_origins.py) and
distillation's --teacher-arch use too; and which of them torchvision and timm build as well (their twins),
the networks whose weights export writes under torchvision's names.

    torchvision_twin('resnetv15', 50, 32)     # -> 'resnet50'; None for a network torchvision does not build
"""
ARCHITECTURES = ('resnetv1', 'resnetv15', 'resnextv1', 'resnextv15', 'xception')

# depth -> (residual unit, units per stage); ResNeXt uses the bottleneck depths. ResNet-10, one basic unit per
# stage (NVIDIA TAO's resnet10; timm's resnet10t adds a deep stem), has 4.9M of ResNet-18's 11.2M weights and
# trains about twice as fast on a CPU: for quick runs on small images, such as the test suite's.
RESNET_DEPTHS = {10: ('basic', (1, 1, 1, 1)), 18: ('basic', (2, 2, 2, 2)), 34: ('basic', (3, 4, 6, 3)),
                 50: ('bottleneck', (3, 4, 6, 3)), 101: ('bottleneck', (3, 4, 23, 3)),
                 152: ('bottleneck', (3, 8, 36, 3))}
RESNEXT_WIDTH_PER_GROUP = 4     # the "4d" of ResNeXt-50 32x4d: channels per group in the first stage

# (--arch, --num-layers, --num-groups or None) -> the torchvision.models builder of the same network (timm's
# model of that name is the same network too). ResNet v1 is v1.5 at 18 and 34 layers (basic units have no 1x1
# convolution for the stride); torchvision's other ResNeXts have 8 channels per group (resnext101_32x8d), its
# wide ResNets twice the bottleneck width.
TORCHVISION_TWINS = {**{('resnetv1', depth, None): f'resnet{depth}' for depth in (18, 34)},
                     **{('resnetv15', depth, None): f'resnet{depth}' for depth in (18, 34, 50, 101, 152)},
                     ('resnextv15', 50, 32): 'resnext50_32x4d', ('resnextv15', 101, 64): 'resnext101_64x4d'}


def torchvision_twin(arch, num_layers, num_groups):
    """The name of torchvision's builder of the network --arch `arch` --num-layers `num_layers` (--num-groups
    `num_groups` for ResNeXt) builds, or None when torchvision builds no such network."""
    groups = num_groups if arch.startswith('resnext') else None
    return TORCHVISION_TWINS.get((arch, num_layers, groups))


def describe_twins():
    """The networks with a torchvision twin, as flags, for messages."""
    flags = [f'--arch {arch} --num-layers {depth}' + (f' --num-groups {groups}' if groups else '') + f' ({name})'
             for (arch, depth, groups), name in TORCHVISION_TWINS.items() if arch != 'resnetv1']
    return '; '.join(flags)
