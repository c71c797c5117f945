"""--mode export's weights for PyTorch: the portable network's parameters (float32, OIHW, 3-channel stem, whatever
the run trained with) under torchvision's names and layout, `<prefix>.torchvision.safetensors`, which
torchvision's network of the same shape, and timm's of the same name, load with strict=True.

    twin = catalogue.torchvision_twin(network.arch, network.num_layers, network.num_groups)   # 'resnet50', or None
    torchvision_weights.write(path, net, twin, network)       # network: the run's nets.network.Network
    loading = torchvision_weights.how_to_load(twin, network, path)

The names come from rn50/checkpoints/weight_conversion.py, the reading's own mapping turned around, so a torchvision file
that --load read comes out bit for bit. Batchnorm: torchvision's default epsilon (1e-5) is the recipe's; a run
with another --batchnorm-eps needs the same epsilon in PyTorch, which `how_to_load` writes into the builder's
call (`norm_layer=functools.partial(torch.nn.BatchNorm2d, eps=...)`, which torchvision's and timm's ResNets take),
and the momentum likewise (MXNet's momentum m is PyTorch's 1 - m: the recipe's 0.9 is PyTorch's default 0.1; it
only matters for fine-tuning).
"""
from rn50.checkpoints import weight_conversion

TORCHVISION_EPS, TORCHVISION_MOMENTUM = 1e-5, 0.1


def write(path, net, twin, network):
    """The parameters of `net` (export's portable network, a ResNet or ResNeXt with the torchvision twin `twin`,
    built of `network`, a nets.network.Network) as torchvision's state dict in a .safetensors file at `path`, with
    what builds the network in its metadata."""
    from safetensors.numpy import save_file
    params = {name: param.data().asnumpy() for name, param in net._collect_params_with_prefix().items()}
    builder = builder_call(twin, network)
    save_file(weight_conversion.to_torchvision(params), path, metadata={'format': 'pt', 'torchvision': builder})


def builder_call(twin, network):
    """torchvision's call that builds `network` (a nets.network.Network), as Python text."""
    return f'torchvision.models.{twin}(num_classes={network.num_classes}{norm_layer(network)})'


def norm_layer(network):
    """The `norm_layer=` argument PyTorch needs for `network`'s batchnorm, or '' for PyTorch's defaults."""
    options = []
    if abs(network.batchnorm_eps - TORCHVISION_EPS) > 1e-12:
        options.append(f'eps={network.batchnorm_eps:g}')
    if abs((1 - network.batchnorm_mom) - TORCHVISION_MOMENTUM) > 1e-12:
        options.append(f'momentum={1 - network.batchnorm_mom:g}')
    return f', norm_layer=functools.partial(torch.nn.BatchNorm2d, {", ".join(options)})' if options else ''


def how_to_load(twin, network, path):
    """{'torchvision': the builder's call, 'timm': timm.create_model's call that loads the file at `path`}, as
    Python text for the log and report_export.json, of `network` (a nets.network.Network). timm's call names the
    class count in the overlay too: timm drops a classifier whose class count differs from its configuration's
    (1000), silently."""
    num_classes, extra = network.num_classes, norm_layer(network)
    return {'torchvision': builder_call(twin, network),
            'timm': f"timm.create_model('{twin}', num_classes={num_classes}{extra}, pretrained=True, "
                    f"pretrained_cfg_overlay=dict(file={path!r}, num_classes={num_classes}))"}
