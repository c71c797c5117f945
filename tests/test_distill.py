"""--teacher (distill.py): the step's loss is the distillation loss written out here, the teacher runs in
inference mode and learns nothing, and train.py distils from any weights it loads."""
import numpy as np
import pytest
from mxnet import autograd

from rn50.training import distill
from rn50.training import losses
import models
from conftest import run_mode, train_main
from float16_twin import Float16Net, batch_of, step_for


def softmax(x, axis=1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.unit
def test_the_loss_mixes_the_labels_and_the_teachers_softened_outputs(dtype):
    alpha, temperature = 0.3, 2.5
    step = step_for(Float16Net(), dtype, extra=['--label-smoothing', '0.1'])
    if step.loss_scale is not None:
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    teacher_net = Float16Net()
    teacher_net.initialize()
    if dtype == 'float16':
        teacher_net.cast('float16')
    teacher_net.collect_params().setattr('grad_req', 'null')
    teacher = object.__new__(distill.Teacher)
    teacher.net, teacher.alpha, teacher.temperature = teacher_net, alpha, temperature
    step.teacher = teacher
    rng = np.random.default_rng(4)
    images, labels = rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)
    batch = batch_of(images, labels, dtype)
    with autograd.record():
        student = step.net(batch.data[0]).asnumpy().astype(np.float64)
    running = teacher_net.bn.running_mean.data().asnumpy().copy()
    teacher_logits = teacher_net(batch.data[0]).asnumpy().astype(np.float64)   # inference mode
    loss = float(step.run(batch, 0, 0, 0.1).asscalar())
    targets = np.full((8, 3), 0.1 / 3)
    targets[np.arange(8), labels] = 0.9 + 0.1 / 3
    label_loss = -(targets * np.log(softmax(student))).sum(1)
    soft_teacher, soft_student = softmax(teacher_logits / temperature), softmax(student / temperature)
    divergence = (soft_teacher * (np.log(soft_teacher) - np.log(soft_student))).sum(1)
    expected = ((1 - alpha) * label_loss + alpha * temperature ** 2 * divergence).mean()
    assert loss == pytest.approx(expected, rel=3e-3 if dtype == 'float16' else 1e-5)
    np.testing.assert_array_equal(teacher_net.bn.running_mean.data().asnumpy(), running)   # inference mode


FLAGS = ['--num-layers', '10', '--num-classes', '10', '--image-shape', '3,32,32', '--data-backend', 'synthetic',
         '--batch-size', '8', '--num-examples', '32', '--num-epochs', '1', '--mode', 'train', '--seed', '2']


def train_py(*argv):
    return run_mode(*FLAGS, *argv, check=False)


def saved_teacher(tmp_path):
    teacher = models.get_model(num_layers=10, num_classes=10, image_shape=(3, 32, 32))
    teacher.initialize()
    teacher.save_parameters(str(tmp_path / 'teacher.params'))
    return tmp_path / 'teacher.params'


@pytest.mark.integration
def test_train_py_distils_from_saved_weights(tmp_path):
    distilled = train_py('--workspace', tmp_path / 'kd', '--teacher', saved_teacher(tmp_path), '--kd-alpha', '0.9',
                         '--kd-temperature', '4')
    assert distilled.returncode == 0, distilled.stderr[-3000:]
    assert 'Distilling from' in distilled.stderr and 'resnetv15, 10 layers' in distilled.stderr


@pytest.mark.unit
def test_train_py_refuses_a_teacher_that_cannot_work(tmp_path):
    teacher = saved_teacher(tmp_path)
    for argv, message in ((['--teacher', tmp_path / 'none.params'], 'no such file'),
                          (['--teacher', teacher, '--teacher-num-layers', '34'],
                           'give --teacher-arch and --teacher-num-layers'),
                          (['--teacher', teacher, '--mode', 'val'], 'does not train')):
        result = train_main(*FLAGS, '--workspace', tmp_path / 'bad', *argv)
        assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
