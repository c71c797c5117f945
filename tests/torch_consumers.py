"""The real consumers of export's torchvision weights, in a process and an environment of their own (PyTorch
must not load after Horovod, and MXNet's and PyTorch's OpenMP runtimes are best kept apart): run as

    .venv-consumers/bin/python tests/torch_consumers.py REQUEST.json

REQUEST.json lists cases {"weights": FILE.safetensors, "builder": "resnet50", "num_classes": N, "eps": E,
"momentum": M, "inputs": FILE.npy, "outputs": PREFIX}: torchvision's builder and timm's model of that name load
the file with strict=True (torchvision: load_state_dict; timm: pretrained=True with the file and the class count
as its pretrained configuration: with its configuration's 1000 classes timm would drop another classifier), both
in eval mode with PyTorch's batchnorm epsilon and momentum set to E and M (torch's convention), and write their
float32 logits of the inputs (N, 3, H, W) to PREFIX.torchvision.npy and PREFIX.timm.npy. A case with
"save": {"file": FILE.safetensors, "seed": S} instead writes the builder's network with random weights and
batchnorm statistics (the seed's) to FILE, as torchvision's own state dict, for a round trip through the recipe;
a case {"keys": "resnet50", "num_classes": N, "outputs": PREFIX} writes the keys, shapes and dtypes of the
builder's state dict, in its order, to PREFIX.keys.json; a case {"snippets": [CODE, ...], "names": [...], "pixels":
FILE.npy, "outputs": PREFIX} runs the documents' PyTorch lines as printed, one after the other in one namespace that
holds what the README's onnxruntime snippet left (`names`, and `pixels` (C, H, W) in the dtype it had) and `timm`
(docs/inference.md's calls use it unimported), and writes what they print to PREFIX.printed.txt and the logits of
`pixels` by each network they assign to `model` (in eval mode, in the order made) to PREFIX.models.npy.
"""
import ast
import contextlib
import functools
import io
import json
import sys

import numpy as np
import safetensors.torch
import timm
import torch
import torchvision


def norm_layer(case):
    return functools.partial(torch.nn.BatchNorm2d, eps=case.get('eps', 1e-5), momentum=case.get('momentum', 0.1))


def randomised(case):
    """torchvision's network of the case with random batchnorm parameters and statistics too, the residual
    branches scaled down as training leaves them (the last batchnorm of each block at a tenth): logits of a few
    units, as a trained network's."""
    torch.manual_seed(case['save']['seed'])
    model = getattr(torchvision.models, case['builder'])(num_classes=case['num_classes'])
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            for tensor, low, high in ((module.weight, 0.5, 1.5), (module.bias, -0.5, 0.5),
                                      (module.running_mean, -0.5, 0.5), (module.running_var, 0.5, 1.5)):
                tensor.data.uniform_(low, high)
            module.num_batches_tracked.fill_(1234)
        if isinstance(module, (torchvision.models.resnet.BasicBlock, torchvision.models.resnet.Bottleneck)):
            last = module.bn3 if isinstance(module, torchvision.models.resnet.Bottleneck) else module.bn2
            last.weight.data.mul_(0.1)
    return model


def logits(model, inputs):
    with torch.no_grad():
        return model.eval()(torch.from_numpy(inputs)).numpy()


def run_snippets(case):
    """The case's snippets as printed, statement by statement (to see each network assigned to `model`)."""
    namespace = {'names': case['names'], 'pixels': np.load(case['pixels']), 'timm': timm}
    printed, models = io.StringIO(), []
    with contextlib.redirect_stdout(printed):
        for code in case['snippets']:
            for statement in ast.parse(code).body:
                exec(compile(ast.Module([statement], []), 'snippet', 'exec'), namespace)
                if namespace.get('model') is not None and not any(namespace['model'] is m for m in models):
                    models.append(namespace['model'])
    with open(case['outputs'] + '.printed.txt', 'w') as f:
        f.write(printed.getvalue())
    np.save(case['outputs'] + '.models.npy', np.concatenate([logits(m, namespace['pixels'][None]) for m in models]))


def run(case):
    if 'snippets' in case:
        run_snippets(case)
        return
    if 'keys' in case:
        with torch.device('meta'):          # shapes and dtypes without weights: no time spent drawing them
            model = getattr(torchvision.models, case['keys'])(num_classes=case['num_classes'])
        with open(case['outputs'] + '.keys.json', 'w') as f:
            json.dump([[key, list(value.shape), str(value.dtype).replace('torch.', '')]
                       for key, value in model.state_dict().items()], f)
        return
    if 'save' in case:
        safetensors.torch.save_file(randomised(case).state_dict(), case['save']['file'])
        return
    inputs = np.load(case['inputs'])
    model = getattr(torchvision.models, case['builder'])(num_classes=case['num_classes'], norm_layer=norm_layer(case))
    model.load_state_dict(safetensors.torch.load_file(case['weights']), strict=True)
    np.save(case['outputs'] + '.torchvision.npy', logits(model, inputs))
    model = timm.create_model(case['builder'], num_classes=case['num_classes'], pretrained=True,
                              norm_layer=norm_layer(case),
                              pretrained_cfg_overlay=dict(file=case['weights'], num_classes=case['num_classes']))
    np.save(case['outputs'] + '.timm.npy', logits(model, inputs))


if __name__ == '__main__':
    torch.set_num_threads(1)
    with open(sys.argv[1]) as f:
        for case in json.load(f):
            run(case)
