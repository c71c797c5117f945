"""Which networks the recipe builds (models.py builds them): the architectures --arch names and the ResNet
depths --num-layers takes, which the readers of foreign weights (rn50/checkpoints/weights.py) and
distillation's --teacher-arch use too.
"""
ARCHITECTURES = ('resnetv1', 'resnetv15', 'resnextv1', 'resnextv15', 'xception')

# depth -> (residual unit, units per stage); ResNeXt uses the bottleneck depths. ResNet-10, one basic unit per
# stage (NVIDIA TAO's resnet10; timm's resnet10t adds a deep stem), has 4.9M of ResNet-18's 11.2M weights and
# trains about twice as fast on a CPU: for quick runs on small images, such as the test suite's.
RESNET_DEPTHS = {10: ('basic', (1, 1, 1, 1)), 18: ('basic', (2, 2, 2, 2)), 34: ('basic', (3, 4, 6, 3)),
                 50: ('bottleneck', (3, 4, 6, 3)), 101: ('bottleneck', (3, 4, 23, 3)),
                 152: ('bottleneck', (3, 8, 36, 3))}
