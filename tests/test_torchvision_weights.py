"""Export's weights for PyTorch (rn50/inference/torchvision_weights.py, weight_conversion.to_torchvision), checked by their
real consumers in a process of their own (tests/torch_consumers.py): torchvision's builder and timm's model of
the same name load model.torchvision.safetensors with strict=True and give MXNet's logits on the same images,
whatever layout, precision and stem the run trained with and with the run's batchnorm epsilon and momentum;
torchvision's own weights come back bit for bit through --load and export; every twin's names and shapes are
torchvision's; a network torchvision does not build gets no such file, and the log names the twins."""
import json
import os
import subprocess

import mxnet as mx
import numpy as np
import pytest
from safetensors.numpy import load_file

import models
from conftest import ROOT, digits_flags, exported, randomise_batchnorm, resolved, train_main
from rn50.checkpoints import weight_conversion, weight_loading
from rn50.data import contract, validation_resize
from rn50.nets import catalogue

TOLERANCE = 1e-4      # float32 logits of the same network in two frameworks (the bound)


# PyTorch's environment (make test makes it): never .venv, where tensorboardX would import it after Horovod
CONSUMERS_PYTHON = os.path.join(ROOT, '.venv-consumers', 'bin', 'python')


def consumers(cases, tmp_path):
    """Run tests/torch_consumers.py on `cases` with PyTorch's environment's Python (a process of its own)."""
    assert os.path.exists(CONSUMERS_PYTHON), 'no .venv-consumers: `make test` makes it (requirements-consumers.txt)'
    request = tmp_path / 'request.json'
    request.write_text(json.dumps(cases))
    result = subprocess.run([CONSUMERS_PYTHON, os.path.join(ROOT, 'tests', 'torch_consumers.py'), str(request)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def trained_looking(net):
    """Random weights and batchnorm statistics, the residual branches scaled down as training leaves them (the
    last batchnorm of each unit at a tenth): logits of a few units, as a trained network's, not thousands."""
    net.initialize(mx.init.Xavier())
    randomise_batchnorm(net)
    for name, param in net._collect_params_with_prefix().items():
        if name.endswith('final_bn.gamma'):
            param.set_data(param.data() * 0.1)
    return net


def checkpoint_in_gpu_layout(path):
    """A ResNet-18 checkpoint as a float16 GPU run writes it: OHWI convolution weights, a 4-channel stem (built
    by shape inference alone: no NHWC convolution runs on this CPU)."""
    net = models.get_model(num_layers=18, num_classes=10, image_shape=(4, 32, 32), dtype='float16', device='gpu',
                           conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC')
    trained_looking(net).save_parameters(str(path))
    return path


def digit_images(digits, count=8):
    """Real images as the exported network takes them: validation digits, preprocessed for a 32x32 network."""
    images = contract.Images.of(resolved(digits_flags(digits) + ['--data-backend', 'mxnet']))
    files = sorted((digits / 'images' / 'val').rglob('*.jpg'))[::45][:count]
    return mx.nd.concat(*[validation_resize.load_image(str(f), images) for f in files], dim=0).asnumpy()


def export_of(source, workspace, *flags):
    """--mode export of the weights file `source` (10 classes at 32x32, synthetic data: no dataset needed)."""
    result = train_main('--mode', 'export', '--load', source, '--num-classes', '10', '--data-backend', 'synthetic',
                        '--num-examples', '8', '--batch-size', '8', '--workspace', workspace, *flags)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads((workspace / 'report_export.json').read_text())['summary']['torchvision']


def mxnet_logits(source, images, flags, arch, depth, groups=32):
    """The logits of the recipe's float32 network with the weights of `source`, as export builds it."""
    args = resolved(['--num-classes', '10', *flags])
    net = models.get_model(arch, depth, num_groups=groups, num_classes=10, image_shape=(3, 32, 32),
                           batchnorm_eps=args.batchnorm_eps)
    net.initialize()
    weight_loading.load_weights(net, str(source), args.rgb_mean, args.rgb_std)
    return net(mx.nd.array(images)).asnumpy(), args


@pytest.mark.integration
def test_torchvision_and_timm_load_the_export_strictly_give_mxnet_s_logits_and_get_their_weights_back(
        digits, tmp_path):
    """Two exports: torchvision's own ResNeXt-50 32x4d (saved by PyTorch, random weights and statistics) read by
    --load, and a ResNet-18 trained in float16 NHWC with a 4-channel stem, batchnorm epsilon 1e-3 and momentum
    0.95. The first comes back bit for bit (num_batches_tracked, which --load does not keep, as 0). torchvision and
    timm load both with strict=True (with the norm_layer the export's report names) and give MXNet's logits on
    real images within TOLERANCE. Every twin's state dict has torchvision's keys, order, shapes and dtypes (the
    documents' PyTorch lines run as printed in tests/test_deployment_snippets.py)."""
    consumers([{'builder': 'resnext50_32x4d', 'num_classes': 10,
                'save': {'file': str(tmp_path / 'torchvision.safetensors'), 'seed': 3}}], tmp_path)
    images = digit_images(digits)
    np.save(tmp_path / 'images.npy', images)
    resnext = ['--arch', 'resnextv15', '--num-layers', '50', '--num-groups', '32']
    resnet = ['--num-layers', '18', '--image-shape', '4,32,32', '--batchnorm-eps', '0.001', '--batchnorm-mom', '0.95']
    sources = {'resnext50_32x4d': (tmp_path / 'torchvision.safetensors', resnext, ('resnextv15', 50)),
               'resnet18': (checkpoint_in_gpu_layout(tmp_path / 'gpu.params'), resnet, ('resnetv15', 18))}
    cases, expected, summaries = [], {}, {}
    for builder, (source, flags, network) in sources.items():
        summaries[builder] = summary = export_of(source, tmp_path / builder, *flags)
        assert summary['file'] == str(tmp_path / builder / 'export' / 'model.torchvision.safetensors')
        assert summary['torchvision'].startswith(f'torchvision.models.{builder}(num_classes=10')
        expected[builder], args = mxnet_logits(source, images, flags, *network)
        cases.append({'weights': summary['file'], 'builder': builder, 'num_classes': 10, 'eps': args.batchnorm_eps,
                      'momentum': 1 - args.batchnorm_mom, 'inputs': str(tmp_path / 'images.npy'),
                      'outputs': str(tmp_path / builder)})
    assert summaries['resnet18']['timm'].startswith("timm.create_model('resnet18', num_classes=10, norm_layer="
                                                    "functools.partial(torch.nn.BatchNorm2d, eps=0.001, momentum=0.05),"
                                                    " pretrained=True")
    assert summaries['resnext50_32x4d']['torchvision'] == 'torchvision.models.resnext50_32x4d(num_classes=10)'

    original = load_file(str(tmp_path / 'torchvision.safetensors'))
    exported = load_file(cases[0]['weights'])
    assert list(exported) == list(original)
    for key, value in original.items():
        if key.endswith('num_batches_tracked'):
            assert value == 1234 and exported[key] == 0 and exported[key].dtype == value.dtype
        else:
            assert exported[key].dtype == value.dtype and np.array_equal(exported[key], value), key

    ours = {}
    for (arch, depth, groups), builder in catalogue.TORCHVISION_TWINS.items():
        net = models.get_model(arch, depth, num_groups=groups or 32, num_classes=7)
        params = {name: np.zeros(param.shape, np.float32) for name, param in net._collect_params_with_prefix().items()}
        ours[builder] = [[key, list(value.shape), value.dtype.name] for key, value in
                         weight_conversion.to_torchvision(params).items()]
        cases.append({'keys': builder, 'num_classes': 7, 'outputs': str(tmp_path / f'twin-{builder}')})
    consumers(cases, tmp_path)
    for builder, keys in ours.items():
        assert json.loads((tmp_path / f'twin-{builder}.keys.json').read_text()) == keys, builder
    for builder, logits in expected.items():
        assert np.abs(logits).max() > 1                      # a network that computes something
        for consumer in ('torchvision', 'timm'):
            difference = np.abs(np.load(tmp_path / f'{builder}.{consumer}.npy') - logits).max()
            print(f'{builder} {consumer}: largest logit difference from MXNet {difference:.2g} (logits up to '
                  f'{np.abs(logits).max():.1f})')
            assert difference < TOLERANCE, (builder, consumer, difference)


@pytest.mark.unit
def test_a_network_without_a_twin_exports_the_rest_and_names_the_twins(tmp_path, caplog):
    """ResNet-10 (and ResNet v1 at 50, ResNeXt-101 32x4d, Xception): torchvision builds no such network, so export
    writes no torchvision file, says so with the twins there are, and writes everything else."""
    assert catalogue.torchvision_twin('resnetv1', 18, 32) == 'resnet18'       # basic units: v1 is v1.5
    for arch, depth, groups in (('resnetv15', 10, 32), ('resnetv1', 50, 32), ('resnextv15', 101, 32),
                                ('resnextv1', 50, 32), ('xception', 50, 32)):
        assert catalogue.torchvision_twin(arch, depth, groups) is None
    trained_looking(models.get_model(num_layers=10, num_classes=10, image_shape=(3, 32, 32))).save_parameters(
        str(tmp_path / 'model_best.params'))
    args = resolved(['--num-layers', '10', '--num-classes', '10', '--image-shape', '3,32,32', '--data-backend',
                     'synthetic', '--num-examples', '8', '--batch-size', '8', '--mode', 'export', '--workspace',
                     str(tmp_path)])
    with caplog.at_level('INFO'):
        outputs = exported(args)
    assert outputs['torchvision'] is None
    assert sorted(os.listdir(tmp_path / 'export')) == ['model-0000.params', 'model-symbol.json', 'model.onnx',
                                                       'model.preprocessing.json']
    said = [r.getMessage() for r in caplog.records if 'torchvision builds no twin' in r.getMessage()]
    assert len(said) == 1 and '--arch resnetv15 --num-layers 10' in said[0]
    assert '--arch resnextv15 --num-layers 50 --num-groups 32 (resnext50_32x4d)' in said[0]
