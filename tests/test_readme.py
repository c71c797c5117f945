"""The README is the user's manual, and docs/ its chapters: their runner commands are accepted as printed, their
links lead somewhere, the README stays short enough to read and indexes every document, and its quick start
takes a folder of images to a trained model, predictions and an ONNX model that its own Python snippet runs."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import fit

from conftest import ROOT, report_gpus, runner_module, runner_runs

README = os.path.join(ROOT, 'README.md')
DOCS_FOLDER = os.path.join(ROOT, 'docs')
DOCS = [README] + [os.path.join(DOCS_FOLDER, name) for name in sorted(os.listdir(DOCS_FOLDER)) if name.endswith('.md')]
# The README is read top to bottom; the rest is in docs/ (issue 38, item 5).
README_LIMIT = 25_000
# How far the README's onnxruntime snippet's probabilities may be from --mode pred's: the README's bound (Pillow
# rounds pixels a little differently from DALI and OpenCV; tests/test_preprocessing.py measures it).
SNIPPET_TOLERANCE = 0.03
# Small enough for CI, appended to the quick start's commands (the runner's and train.py's last occurrence wins).
SMALL = ['--num-layers', '10', '--image-shape', '3,32,32', '--data-val-resize', '36', '--min-random-area', '0.5']


def code_blocks(language, path=README):
    with open(path, encoding='utf-8') as f:
        return re.findall(rf'```{language}\n(.*?)```', f.read(), re.S)


def commands(block):
    """The commands of a bash block, continuation lines joined, comments dropped; a word `$NAME` takes the words
    of an assignment NAME="..." made earlier in the block (docs/performance.md shares flags so)."""
    lines, variables = [], {}
    for line in block.replace('\\\n', ' ').split('\n'):
        argv = shlex.split(line, comments=True)
        if len(argv) == 1 and re.fullmatch(r'[A-Za-z_]\w*=.*', argv[0], re.S):
            name, _, value = argv[0].partition('=')
            variables[name] = shlex.split(value)
            continue
        argv = [expanded for word in argv for expanded in (variables.get(word[1:], [word]) if word.startswith('$')
                                                           else [word])]
        if argv:
            lines.append(argv)
    return lines


def runner_lines(path):
    """Each `./runner ...` command of the bash blocks of a file, placeholders such as <path> aside."""
    return [argv for block in code_blocks('bash', path) for argv in commands(block)
            if argv[0] == './runner' and not any('<' in word for word in argv)]


def anchor(title):
    return re.sub(r'[^\w\- ]', '', title.strip().lower()).replace(' ', '-')


@pytest.mark.unit
def test_every_runner_command_of_the_readme_and_docs_is_accepted_as_printed(capsys, monkeypatch):
    """Each `./runner ...` line of a bash block in the README or docs/ (placeholders such as <path> aside) passes
    the runner's checks of its flags and train.py's (--dry-run, the runner's main in this process: files are not
    looked at; the multi-node lines run on a mocked 8-GPU node, where they are meant to be typed, the others on
    this CPU machine)."""
    lines = [(os.path.relpath(path, ROOT), argv) for path in DOCS for argv in runner_lines(path)]
    assert len([1 for path, _ in lines if path == 'README.md']) >= 8
    assert len(lines) >= 40
    runner = runner_module()
    for path, argv in lines:
        multi_node = any(word in argv for word in ('-H', '--hostfile', '--launcher'))
        report_gpus(monkeypatch, 8 if multi_node else 0)
        capsys.readouterr()
        code = runner.main(argv[1:] + ['--dry-run'])
        assert code == 0, (path, shlex.join(argv), capsys.readouterr().err[-1500:])


# The datasets and workspaces a documented command makes (make demo, the quick start, prepare_imagenet.sh's default
# and the runner's): any other path a command reads must be a placeholder such as <path> or an UPPER-CASE word.
DOCUMENTED_DATA = ('data/demo/rec', 'data/photos', '/data/imagenet/train-val-recordio-passthrough')
PATH_FLAGS = ('--data-root', '--workspace', '--load', '--teacher', '--data-pred', '-o', '--output', '--triton')


def placeholder(word):
    return '<' in word or bool(re.fullmatch(r'[A-Z][A-Z_]*', word))


def training_settings(argv, multi_node):
    """(the workspace, the run settings) of a training command of the docs, resolved as its train.py would
    (resume.run_settings, the settings a workspace's run must keep), or None for another mode."""
    import train
    from rn50.checkpoints import resume
    from rn50.config import resolve
    runner = runner_module()
    args, forwarded = runner.parse_args(argv[1:])
    gpus = 8 if multi_node else 0
    command = runner.train_command(args, forwarded, gpus, bool(gpus), [])
    targs, origin = train.parse_flags(command[2:])
    if targs.mode not in ('train', 'train_val'):
        return None
    targs = resolve.for_run(targs, origin, on_gpu=bool(gpus))[0]
    return os.path.normpath(targs.workspace), resume.run_settings(targs, fit.RESUMED_SETTINGS)


@pytest.mark.unit
def test_the_documented_commands_do_not_collide_when_run_in_the_order_printed(monkeypatch):
    """Each document's commands, run in the order printed: no two training commands share a workspace (the
    default ./ counts: the second would be refused as another run's, or continue it), no two commands write one
    output file, and every dataset a command reads is one a documented command makes, or a marked placeholder
    (<...>, or an UPPER-CASE word). The docs' accumulation example, two commands in ./, could not run as printed."""
    problems = []
    for path in DOCS:
        runs, outputs = {}, {}
        for block in code_blocks('bash', path):
            for argv in commands(block):
                where = f'{os.path.relpath(path, ROOT)}: {shlex.join(argv)}'
                if argv[0] == 'srun':
                    argv = argv[argv.index('./runner'):]
                if argv[0] not in ('./runner', 'python') or any(placeholder(word) for word in argv):
                    continue
                values = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag in PATH_FLAGS}
                if values.get('--data-root', DOCUMENTED_DATA[0]) not in DOCUMENTED_DATA:
                    problems.append(f'{where}: a dataset no documented command makes (or mark it: <...>)')
                output = values.get('-o') or values.get('--output')
                if output and output in outputs:
                    problems.append(f'{where}: writes {output}, as {outputs[output]} does')
                outputs.setdefault(output, where)
                if argv[0] != './runner' or '--dry-run' in argv:
                    continue
                report_gpus(monkeypatch, 8)
                found = training_settings(argv, any(word in argv for word in ('-H', '--hostfile', '--launcher')))
                if found is None:
                    continue
                workspace, settings = found
                earlier = runs.setdefault(workspace, (where, settings, argv))
                if settings != earlier[1]:
                    problems.append(f'{where}: refused in {workspace}, which {earlier[0]} trains')
                elif argv != earlier[2]:
                    problems.append(f'{where}: would continue the run of {earlier[0]} in {workspace}')
    assert not problems, '\n'.join(problems)


@pytest.mark.unit
def test_the_readme_is_short_and_indexes_every_document():
    """README.md is at most README_LIMIT bytes (fifteen minutes' reading), and its Documents section links every
    file of docs/."""
    with open(README, 'rb') as f:
        size = len(f.read())
    assert size <= README_LIMIT, f'README.md is {size} bytes, more than {README_LIMIT}: move details to docs/'
    with open(README, encoding='utf-8') as f:
        text = f.read()
    index = re.search(r'^## Documents\n(.*?)(?=^## |\Z)', text, re.M | re.S)
    assert index, 'README.md has no "## Documents" section'
    linked = {os.path.normpath(target.partition('#')[0]) for target in re.findall(r'\]\(([^)\s]+)\)', index.group(1))}
    missing = [name for name in sorted(os.listdir(DOCS_FOLDER))
               if os.path.isfile(os.path.join(DOCS_FOLDER, name)) and os.path.join('docs', name) not in linked]
    assert not missing, f"README.md's Documents section does not link {missing}"


@pytest.mark.unit
def test_every_link_leads_somewhere():
    """Relative links name existing files, and #anchors existing headings (in the README and docs/)."""
    for path in DOCS:
        with open(path, encoding='utf-8') as f:
            text = f.read()
        for target in re.findall(r'\]\(([^)\s]+)\)', text):
            if target.startswith('http'):
                continue
            file, _, fragment = target.partition('#')
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            assert os.path.exists(linked), f'{path}: link to {target}: no such file'
            if fragment:
                with open(linked, encoding='utf-8') as f:
                    headings = {anchor(h) for h in re.findall(r'^#+ (.*)$', f.read(), re.M)}
                assert fragment in headings, f'{path}: link to {target}: no such heading'


@pytest.mark.integration
def test_the_quick_start_takes_a_folder_of_images_to_a_model_predictions_and_onnx(digits, tmp_path):
    """The quick start's four commands, run as printed in a folder that has photos/<class>/<image> (the demo's
    training digits; the programs named by their path in the repository), with a smaller network and image
    size appended. Then its Python snippet runs the ONNX
    model and names the same classes as --mode pred."""
    shutil.copytree(digits / 'images' / 'train', tmp_path / 'photos')
    quick_start = next(block for block in code_blocks('bash') if 'prepare_dataset.py photos' in block)
    new_photos = tmp_path / 'new_photos'
    new_photos.mkdir()
    samples = [sorted((digits / 'images' / 'val' / f'digit_{d}').iterdir())[0] for d in (3, 5, 7, 8)]
    for sample in samples:
        shutil.copy(sample, new_photos / f'{sample.parent.name}_{sample.name}')
    outputs = []
    for argv in commands(quick_start):
        extra = [] if argv[1] == 'scripts/prepare_dataset.py' else SMALL
        if argv[0] == './runner' and '--mode' not in argv:
            extra = extra + ['-e', '1', '-b', '16', '--num-examples', '256']
        if '--mode' in argv and argv[argv.index('--mode') + 1] == 'pred':
            extra = extra + ['--pred-output', str(tmp_path / 'predictions.json')]
        if argv[0] == './runner':       # one worker: the runner and its train.py in this process
            result = runner_runs(*argv[1:], *extra, cwd=tmp_path)
        else:
            assert argv[0] == 'python', argv
            result = subprocess.run([sys.executable, os.path.join(ROOT, argv[1])] + argv[2:] + extra,
                                    capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert result.returncode == 0, (shlex.join(argv), result.stderr[-2000:])
        outputs.append(result)
    assert (tmp_path / 'data' / 'photos' / 'val.rec').exists()
    assert '10 classes, as data/photos/classes.json lists them' in (tmp_path / 'runs' / 'photos' / 'log.log').read_text()
    predictions = json.loads((tmp_path / 'predictions.json').read_text())['predictions']
    assert len(predictions) == len(samples)
    onnx_model = tmp_path / 'runs' / 'photos' / 'export' / 'model.onnx'
    assert onnx_model.exists()

    # The snippet's probabilities for pred's top classes: it reads the model's preprocessing.json (32x32 after a
    # 36 resize here), and Pillow rounds pixels a little differently from DALI, so probabilities are compared
    # within the README's bound, and the names only where pred's top class leads by more than twice that (an
    # argmax between near-equal scores is no test).
    snippet = next(block for block in code_blocks('python') if '.preprocessing.json' in block)
    snippet = (snippet.replace("'runs/photos/export/model.onnx'", repr(str(onnx_model)))
               .replace("'data/photos/classes.json'", repr(str(tmp_path / 'data' / 'photos' / 'classes.json'))))
    snippet += 'shifted = np.exp(logits[0] - logits[0].max())\nprint(json.dumps((shifted / shifted.sum()).tolist()))\n'
    for prediction in predictions:      # as a user runs it (python classify.py): an interpreter of its own
        run = subprocess.run([sys.executable, '-c', snippet.replace("'new_photos/cat.jpg'", repr(prediction['image']))],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        name, probabilities = run.stdout.strip().split('\n')
        probabilities = json.loads(probabilities)
        top = prediction['top']
        for entry in top:
            assert abs(probabilities[entry['class']] - entry['probability']) < SNIPPET_TOLERANCE, (entry, probabilities)
        if top[0]['probability'] - top[1]['probability'] > 2 * SNIPPET_TOLERANCE:
            assert name == top[0]['name'], (name, prediction)


@pytest.mark.unit
def test_what_the_documented_commands_write_in_the_repository_is_ignored_by_git():
    """A run in the default workspace ./ and the benchmark's report write into the checkout: git ignores all of it
    (report_val.json and report.json.points/ used to show as untracked files)."""
    written = ['log.log', 'dllogger_log.log', 'report.json', 'report_val.json', 'report_export.json',
               'report.json.points/1x8/output.log', 'report.json.throughput.png', 'model_best.params',
               'model_last.state', 'export/model.onnx', 'tensorboard/events', 'mlperf.log',
               'benchmark_report_tf32.json', 'benchmark_report_tf32.json.points/1x512/dllogger.log',
               'inferbenchmark_report_fp32.json.scaling.png', 'runs/demo/log.log', 'data/demo/rec/val.rec']
    result = subprocess.run(['git', 'check-ignore', '--no-index', *written], cwd=ROOT, capture_output=True, text=True)
    assert sorted(result.stdout.split()) == sorted(written), set(written) - set(result.stdout.split())


@pytest.mark.unit
def test_the_help_groups_the_docs_name_are_train_py_s():
    """docs/training.md named groups that --help calls otherwise, and left out MLPerf's."""
    import train
    titles = [group.title for group in train.build_parser()._action_groups[2:]]   # after positional, options
    with open(os.path.join(DOCS_FOLDER, 'training.md'), encoding='utf-8') as f:
        named = re.search(r'all the others, in groups \(([^)]*)\)', f.read().replace('\n', ' ')).group(1)
    assert named.split(', ') == titles
