"""The optimizer of `--optimizer NAME`, built in one place from a handful of keyword values (as timm's
optimizer_kwargs and create_optimizer_v2):

    factory.add_args(group)                                         # fit.py's Training group: --optimizer, --mom, --wd
    optimizer = factory.create(**factory.optimizer_kwargs(args))    # step.py hands it to gluon.Trainer

This is the one place --optimizer names map to classes: 'lars' is MLPerf's LARS (lars.py), 'lamb' timm's LAMB
(lamb.py), and every other name is MXNet's, looked up in MXNet's own registry as gluon.Trainer would (case
aside: sgd, nag, adam, ...). No module of this recipe registers an optimizer with MXNet: MXNet's 'lars' and
'lamb' stay MXNet's, and a name is never resolved through an import's side effect.
"""
import mxnet as mx

from rn50 import flags
from rn50.optim import lamb
from rn50.optim import lars

# --optimizer names with this recipe's own class (the name exactly as given); any other is MXNet's. MXNet's
# lars skips parameters by names Gluon never gives, its lamb adapts every array and clips no gradient norm.
OPTIMIZERS = {'lars': lars.MLPerfLARS, 'lamb': lamb.TimmLAMB}

# Optimizers whose MXNet implementation takes a momentum argument (--mom).
MOMENTUM_OPTIMIZERS = ('sgd', 'nag', 'signum', 'dcasgd', 'lbsgd')


def add_args(group):
    """The optimizer's flags, in fit.py's Training group (LARS's own: lars.add_args)."""
    group.add_argument('--optimizer', default='sgd',
                       help='any MXNet optimizer name; lars is MLPerf\'s (lars.py), lamb timm\'s (lamb.py)')
    group.add_argument('--mom', type=flags.real(minimum=0, maximum=1), default=0.875,
                       help='momentum (sgd, nag, signum, dcasgd, lbsgd)')
    group.add_argument('--wd', type=flags.real(minimum=0), default=1 / 32768,
                       help='weight decay; never applied to batchnorm gamma/beta or biases')


def optimizer_class(name):
    """The class of `--optimizer name`; ValueError naming the choices for a name neither has."""
    if name in OPTIMIZERS:
        return OPTIMIZERS[name]
    registry = mx.optimizer.Optimizer.opt_registry
    if name.lower() not in registry:
        mxnets = sorted(set(registry) - set(OPTIMIZERS) - {'test'})     # 'test': MXNet's own tests' optimizer
        raise ValueError(f'no such optimizer: this recipe\'s {" and ".join(OPTIMIZERS)}, or one of MXNet\'s: '
                         f'{", ".join(mxnets)}')
    return registry[name.lower()]


def optimizer_kwargs(args):
    """The keyword values of `create` from the parsed flags (--optimizer, --wd, --mom, --dtype, --lars-*)."""
    return dict(name=args.optimizer, weight_decay=args.wd, momentum=args.mom,
                multi_precision=args.dtype == 'float16', lars_eta=args.lars_eta, lars_eps=args.lars_eps)


def create(name, weight_decay, momentum, multi_precision, lars_eta, lars_eps, learning_rate=0.0):
    """The optimizer `name` (an instance, for gluon.Trainer), from keyword values: the learning rate (0: the
    training step sets each iteration's), the weight decay, float32 master weights for float16 ones
    (multi_precision); the momentum for the optimizers that take one (MOMENTUM_OPTIMIZERS, and lars), and
    lars's trust coefficient and epsilon. ValueError for an unknown name, TypeError for a keyword the class
    does not take (as MXNet's registry would raise them)."""
    params = {'learning_rate': learning_rate, 'wd': weight_decay, 'multi_precision': multi_precision}
    if name in MOMENTUM_OPTIMIZERS:
        params['momentum'] = momentum
    if name == 'lars':    # MLPerf's LARS, not MXNet's, which skips by names Gluon never gives
        params.update(momentum=momentum, eta=lars_eta, eps=lars_eps)
    return optimizer_class(name)(**params)
