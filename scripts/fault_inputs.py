"""The bad-input class of scripts/fault_campaign.py: the damaged files to feed, the cases (flags out of range,
impossible combinations, data files, images for --mode pred, weights files), the finished run's workspace they
must leave unchanged, and the check of one case: exit status 2, exactly one `error:` line, no Traceback.

    from fault_inputs import bad_input_campaign
    bad_input_campaign(camp)        # camp: fault_campaign.Campaign (datasets, baselines, rows)
"""
import os
import shutil
import time

from fault_tools import (LOGS, link_copy, one_error, run, run_forked, runner_argv, snapshot, train_argv,
                         unchanged)


def make_bad_files(folder, rec, trained):
    """Damaged data, images and weights files in `folder` (made once), from the RecordIO folder `rec` and the
    workspace `trained` of a finished run; returns `folder`."""
    if os.path.exists(os.path.join(folder, 'done')):
        return folder
    import mxnet as mx
    import models
    os.makedirs(folder, exist_ok=True)
    train_rec = open(os.path.join(rec, 'train.rec'), 'rb').read()
    files = {'garbage.rec': os.urandom(50000), 'truncated.rec': train_rec[:len(train_rec) // 3],
             'garbage.idx': b'hello world\n', 'empty.idx': b'', 'text.jpg': b'hello, not an image\n', 'empty.png': b'',
             'text.params': b'not weights\n', 'weights.pth': b'\x80\x02}q\x00.', 'weights.txt': b'1 2 3\n',
             'garbage.npz': b'PK\x03\x04 not a zip archive', 'truncated.safetensors': b'\xff\x00\x00\x00\x00\x00\x00'}
    for name, content in files.items():
        with open(os.path.join(folder, name), 'wb') as f:
            f.write(content)
    os.makedirs(os.path.join(folder, 'no-images'), exist_ok=True)
    open(os.path.join(folder, 'no-images', 'readme.txt'), 'w').write('no images here\n')
    os.makedirs(os.path.join(folder, 'bad-images'), exist_ok=True)
    shutil.copyfile(os.path.join(folder, 'text.jpg'), os.path.join(folder, 'bad-images', 'a.jpg'))
    source = mx.recordio.MXIndexedRecordIO(os.path.join(rec, 'train.idx'), os.path.join(rec, 'train.rec'), 'r')
    for name, change in (('labels99', lambda i, h, img: (h._replace(label=99.0) if i == 7 else h, img)),
                         ('undecodable', lambda i, h, img: (h, b'not a jpeg' * 20 if i == 5 else img))):
        out = mx.recordio.MXIndexedRecordIO(os.path.join(folder, f'{name}.idx'), os.path.join(folder, f'{name}.rec'),
                                            'w')
        for i in range(64):
            header, image = mx.recordio.unpack(source.read_idx(source.keys[i]))
            out.write_idx(i, mx.recordio.pack(*change(i, header, image)))
        out.close()
    best = os.path.join(trained, 'model_best.params')
    content = open(best, 'rb').read()
    open(os.path.join(folder, 'truncated.params'), 'wb').write(content[:len(content) // 2])
    state = open(os.path.join(trained, 'model_last.state'), 'rb').read()
    open(os.path.join(folder, 'damaged.state'), 'wb').write(state[:len(state) - 1000])
    for name, layers, classes in (('resnet34.params', 34, 10), ('classes5.params', 18, 5)):
        net = models.get_model(num_layers=layers, num_classes=classes, image_shape=(3, 32, 32))
        net.initialize()
        net.save_parameters(os.path.join(folder, name))
    mx.nd.save(os.path.join(folder, 'list.params'), [mx.nd.ones((2, 2))])
    open(os.path.join(folder, 'done'), 'w').close()
    return folder



def bad_inputs(rec, bad):
    """(name, kind, extra flags, about) with the digits' RecordIO folder `rec` and make_bad_files' folder `bad`:
    kind 'train' runs train.py in a copy of a finished run's workspace, 'train-new' in a new one,
    'runner1'/'runner2' the runner with 1/2 workers in a copy; `about`, a piece of the one error line the case
    must give (an error about something else does not count)."""
    r, b = (lambda name: os.path.join(rec, name)), (lambda name: os.path.join(bad, name))

    def data(train_rec=r('train.rec'), train_idx=r('train.idx'), backend='mxnet', val=True):
        flags = ['--data-backend', backend, '--data-train', train_rec, '--data-train-idx', train_idx,
                 '--data-val-resize', '32']
        return flags + (['--data-val', r('val.rec'), '--data-val-idx', r('val.idx')] if val else [])

    def undecodable(backend):   # one epoch of the 64 records, among them the undecodable one
        return data(b('undecodable.rec'), b('undecodable.idx'), backend) + ['--num-epochs', '1', '--num-examples', '64']
    cases = [(f'flag {" ".join(f)}', 'train', f, f[0]) for f in (
        ['--batch-size', '0'], ['--batch-size', '-32'], ['--lr', '-1'], ['--lr', 'nan'], ['--lr', 'inf'],
        ['--wd', 'nan'], ['--mom', '1.5'], ['--label-smoothing', '2'], ['--mixup', '-1'], ['--warmup-epochs', '-1'],
        ['--num-epochs', '0'], ['--run-epochs', '0'], ['--disp-batches', '0'], ['--seed', '-1'],
        ['--num-layers', 'x'], ['--num-layers', '19'], ['--num-classes', '0'], ['--image-shape', '2,32,32'],
        ['--image-shape', '3,32'], ['--rgb-mean', '1,inf,2'], ['--gpus', '0,-1'], ['--save-frequency', '-2'],
        ['--topk', '0'], ['--num-examples', '0'], ['--batchnorm-eps', '0'], ['--dali-threads', '0'],
        ['--no-such-flag'], ['--mode', 'bogus'])]
    cases += [(f'runner {" ".join(f)}', 'runner1', f, f'argument {f[0]}') for f in (
        ['-n', '0'], ['-b', '0'], ['-l', 'nan'], ['-e', '0'], ['--stop-timeout', '0'])]
    cases += [('runner -n 2 with train.py flag --lr-factor 0', 'runner2', ['--lr-factor', '0'], 'argument --lr-factor')]
    cases += [(f'combination {name}', kind, flags, about) for name, kind, flags, about in (
        ('dali-gpu without a GPU', 'train', ['--data-backend', 'dali-gpu'], 'dali-gpu needs a GPU'),
        ('float16 on the CPU', 'train', ['--dtype', 'float16'], '--dtype float16 needs a GPU'),
        ('--gpus 0 without a GPU', 'train', ['--gpus', '0'], '--gpus 0 asks for GPUs'),
        ('train_val without --data-val', 'train-new', data(val=False), 'train_val needs validation data'),
        ('--quantize int8 in train mode', 'train', ['--quantize', 'int8'], '--quantize int8 is for --mode val'),
        ('--quantize int8 with export', 'train', ['--mode', 'export', '--quantize', 'int8'], 'not --mode export'),
        ('pred without --data-pred', 'train', ['--mode', 'pred'], 'needs --data-pred'),
        ('--rgb-mean with 2 values', 'train', ['--rgb-mean', '1,2'], '--rgb-mean and --rgb-std take 3 values'),
        ('--data-val-resize below the image', 'train', ['--data-val-resize', '16'], 'smaller than the image'),
        ('min random area above max', 'train', ['--min-random-area', '0.9', '--max-random-area', '0.5'],
         '--min-random-area 0.9 and --max-random-area 0.5'),
        ('--random-crop with dali-cpu', 'train', data(backend='dali-cpu') + ['--random-crop', '1'],
         '--random-crop: only --data-backend mxnet'),
        ('--optimizer nosuch', 'train-new', ['--optimizer', 'nosuch'], 'no such optimizer'),
        ('-n 2 --kv-store device on CPUs', 'runner2', ['--kv-store', 'device'], '--kv-store device drives the GPUs'),
        ('--test-io-mode val without --data-val', 'train', data(val=False) + ['--test-io', '--test-io-mode', 'val'],
         '--test-io-mode val needs --data-val'),
        ('NHWC convolutions on the CPU', 'train', ['--conv-layout', 'NHWC'], '--conv-layout NHWC'),
        ('resume a ResNet-18 state as ResNet-34', 'train', ['--num-layers', '34'], '--num-layers 18 in the saved run'),
        ('resume a 10-class state with 5 classes', 'train', ['--num-classes', '5'],
         '--num-classes 10 in the saved run'))]
    # Training on other data than the finished run's runs in a new workspace: in the template's, resuming another
    # run's state would be refused first ("belongs to a run with other settings"), before the data are looked at.
    cases += [(f'data {name}', 'train-new', flags, about) for name, flags, about in (
        ('missing .rec', data(train_rec=b('missing.rec')), 'missing.rec\' not found'),
        ('missing .idx', data(train_idx=b('missing.idx')), 'missing.idx\' not found'),
        ('garbage .rec', data(train_rec=b('garbage.rec')), 'does not match ' + b('garbage.rec')),
        ('garbage .rec (dali-cpu)', data(train_rec=b('garbage.rec'), backend='dali-cpu'),
         'does not match ' + b('garbage.rec')),
        ('truncated .rec', data(train_rec=b('truncated.rec')), 'does not match ' + b('truncated.rec')),
        ('garbage .idx', data(train_idx=b('garbage.idx')), 'garbage.idx line 1 is not'),
        ('empty .idx', data(train_idx=b('empty.idx')), 'empty.idx lists no records'),
        ('.idx of another .rec', data(train_idx=r('val.idx')), 'val.idx does not match'),
        ('label 99 of 10 classes', data(train_rec=b('labels99.rec'), train_idx=b('labels99.idx')), 'has label 99'),
        ('undecodable image (mxnet)', undecodable('mxnet'), 'record 5 of ' + b('undecodable.rec')),
        ('undecodable image (dali-cpu)', undecodable('dali-cpu'), 'record 5 of ' + b('undecodable.rec')))]
    cases += [('data --mode val with a missing .rec', 'train', ['--mode', 'val', '--data-backend', 'mxnet',
                                                                '--data-val', b('missing.rec'), '--data-val-idx',
                                                                r('val.idx')], 'validation data')]
    cases += [(f'pred {name}', 'train', ['--mode', 'pred', '--data-pred', path], path) for name, path in (
        ('text file named .jpg', b('text.jpg')), ('empty .png', b('empty.png')),
        ('folder without images', b('no-images')), ('missing path', b('missing.jpg')),
        ('folder of unreadable images', b('bad-images')))]
    cases += [(f'weights {name}', 'train', ['--mode', 'val', '--load', b(file)], b(file)) for name, file in (
        ('text in .params', 'text.params'), ('truncated .params', 'truncated.params'),
        ('ResNet-34 into ResNet-18', 'resnet34.params'), ('5 classes into 10', 'classes5.params'),
        ('.pth pickle', 'weights.pth'), ('unknown suffix .txt', 'weights.txt'), ('missing file', 'missing.params'),
        ('garbage .npz', 'garbage.npz'), ('truncated .safetensors', 'truncated.safetensors'),
        ('unnamed list of arrays', 'list.params'), ('truncated .state', 'damaged.state'))]
    return cases


def bad_input_template(camp):
    """A workspace with a finished run's weights, last state and logs (what a bad input must not touch)."""
    template = os.path.join(camp.workdir, 'bad-template')
    if not os.path.exists(os.path.join(template, 'model_last.state')):
        os.makedirs(template, exist_ok=True)
        for name in ('model_best.params', 'model_last.state', 'report.json') + LOGS:
            shutil.copyfile(os.path.join(camp.baseline(1), name), os.path.join(template, name))
    return template


def bad_input_argv(ws, kind, extra):
    """The command line of a case of `kind` in workspace `ws` (train.py's are run forked, without their first
    two items)."""
    return train_argv(ws, *extra) if kind.startswith('train') else runner_argv(ws, int(kind[-1]), *extra)


def bad_folders(camp, make=True):
    """(the digits' RecordIO folder, make_bad_files' folder) of the cases, made first unless `make` is False."""
    rec = camp.digits(make)
    bad = os.path.join(camp.workdir, 'bad')
    return rec, make_bad_files(bad, rec, camp.baseline(1)) if make else bad


def bad_input_commands(camp):
    """(row name, argv, about) of every bad-input row, built as the rows build them, without running or making
    anything (tests/test_faults.py parses them)."""
    ws = os.path.join(camp.workdir, 'runs', 'bad00')
    return [(f'bad-input/{name}', bad_input_argv(ws, kind, extra), about)
            for name, kind, extra, about in bad_inputs(*bad_folders(camp, make=False))]


def bad_input_row(camp, template, number, name, kind, extra, about):
    start = time.time()
    ws = os.path.join(camp.workdir, 'runs', f'bad{number:02d}')
    if kind != 'train-new':
        link_copy(template, ws)
    before = snapshot(ws)
    argv = [str(a) for a in bad_input_argv(ws, kind, extra)]
    if kind.startswith('train'):
        code, out, err = run_forked(argv[2:])
    else:
        code, out, err = run(argv, timeout=300)
    ok, text = one_error(code, out, err, about)
    changes = unchanged(before, ws)
    shutil.rmtree(ws, ignore_errors=True)
    return f'bad-input/{name}', ok and not changes, f'{text}; {changes or "workspace unchanged"}', time.time() - start


def bad_input_campaign(camp):
    cases = [c for c in bad_inputs(*bad_folders(camp)) if camp.selected(f'bad-input/{c[0]}')]
    if camp.quick:
        cases = cases[::6]
    template = bad_input_template(camp)
    expected = 'exit 2, one error: line about the case, no Traceback, workspace unchanged'
    for i, case in enumerate(cases):     # one at a time: forking from a threaded process is unsafe
        name, ok, observed, seconds = bad_input_row(camp, template, i, *case)
        camp.row(name, expected, observed, ok, seconds)
