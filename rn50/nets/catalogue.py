"""Which networks the recipe builds (models.py builds them): the architectures --arch names and the ResNet
depths --num-layers takes, which the readers of foreign weights (rn50/checkpoints/weights.py) and
distillation's --teacher-arch use too.
"""
ARCHITECTURES = ('resnetv1', 'resnetv15', 'resnextv1', 'resnextv15', 'xception')

# depth -> (residual unit, units per stage); ResNeXt uses the bottleneck depths
RESNET_DEPTHS = {18: ('basic', (2, 2, 2, 2)), 34: ('basic', (3, 4, 6, 3)), 50: ('bottleneck', (3, 4, 6, 3)),
                 101: ('bottleneck', (3, 4, 23, 3)), 152: ('bottleneck', (3, 8, 36, 3))}
