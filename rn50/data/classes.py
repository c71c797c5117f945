"""Class-name files: the formats `--classes` accepts and the classes.json beside the data, read into one name
per class (name i for label i, the label the network was trained on).

    names = classes.read_names('data/pets/classes.json', num_classes=37, flag='--classes')

The formats, all written or read by the recipe itself:

* classes.json as scripts/prepare_dataset.py writes it:
  {"classes": [{"index": 0, "folder": "n01440764", "name": "tench, Tinca tinca"}, ...]}
  (an entry without "name" is named by its "folder"; without "index", by its position);
* {"classes": ["tench", "goldfish", ...]}, or the list alone: ["tench", ...] (entries as above also allowed);
* prepare_dataset.py --names' text: "folder<TAB>name" lines, and imagenet_classes.txt's "n01440764 tench, ..."
  lines (a WordNet id, a space, the name). Classes are numbered in sorted folder order, as prepare_dataset.py
  numbers the class folders;
* plain text: one name per line, line i naming class i (blank lines are skipped).

Anything else, and a file naming another number of classes than the network has, is a RecipeError: a wrong
count would label every prediction with the wrong name without a word.

The class count itself comes from the same file when --num-classes is not given (`resolve_count`): a 3-class
dataset never trains a 1000-way classifier by accident, and a --num-classes that contradicts it is an error.
"""
import json
import os
import re

from rn50 import files
from rn50.errors import RecipeError

# ImageNet's 1000 class names ("n01440764 tench, Tinca tinca" lines), for a 1000-class run without --classes
IMAGENET_NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'imagenet_classes.txt')
FORMATS = ('prepare_dataset.py\'s classes.json, {"classes": [...]} or a JSON list of names, "folder<TAB>name" '
           'lines (prepare_dataset.py --names), "n01440764 name" lines (imagenet_classes.txt), or one name '
           'per line')
WORDNET_LINE = re.compile(r'n[0-9]{8} \S')
DEFAULT_COUNT = 1000   # ImageNet's, for data that come without a classes.json (synthetic, im2rec's files)


def dataset_file(*data_files):
    """The classes.json beside the first of `data_files` (.rec paths, None for absent) whose folder has one:
    where scripts/prepare_dataset.py writes it; None when there is none."""
    for data_file in data_files:
        path = os.path.join(os.path.dirname(data_file), 'classes.json') if data_file else None
        if path and os.path.isfile(path):
            return path
    return None


def resolve_count(num_classes, data_files):
    """(class count, where it came from): --num-classes when given (`num_classes` not None) and consistent with
    the dataset's classes.json, else that file's count, else DEFAULT_COUNT. RecipeError when they contradict."""
    path = dataset_file(*data_files)
    if path is None:
        return (DEFAULT_COUNT, 'the default') if num_classes is None else (num_classes, '--num-classes')
    count = len(read_names(path, None, flag='the dataset\'s'))
    if count < 2:
        raise RecipeError(f'the dataset\'s {path} names {count} class: nothing can be learned from one class (every '
                          'answer would be right, a top-1 of 1.0). Give prepare_dataset.py a folder with one '
                          'sub-folder per class, at least 2')
    if num_classes is None:
        return count, path
    if num_classes != count:
        raise RecipeError(f'--num-classes {num_classes} contradicts the dataset\'s {path}, which names {count} '
                          f'classes: leave --num-classes out (the count comes from that file) or give {count}')
    return count, '--num-classes'


def read_names(path, num_classes, flag='--classes'):
    """The names the file at `path` gives, in label order; RecipeError for an unreadable file, an unknown
    format or another number of classes than `num_classes` (None: any number)."""
    where = f'{flag} {path}'
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except FileNotFoundError:
        raise RecipeError(f'{where}: no such file') from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError(f'{where}: cannot be read as text ({e})') from None
    if text.lstrip().startswith(('{', '[')):
        names = json_names(text, where)
    else:
        names = text_names(text, where)
    if num_classes is not None and len(names) != num_classes:
        raise RecipeError(f'{where} names {len(names)} classes but the network has {num_classes} '
                          '(--num-classes): give the file of the dataset the weights were trained on')
    return names


def json_names(text, where):
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecipeError(f'{where} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg}); '
                          f'accepted: {FORMATS}') from None
    entries = document.get('classes') if isinstance(document, dict) else document
    if not isinstance(entries, list) or not entries:
        raise RecipeError(f'{where}: expected a "classes" list or a list of names; accepted: {FORMATS}')
    by_index = {}
    for position, entry in enumerate(entries):
        if isinstance(entry, str):
            index, name = position, entry
        elif isinstance(entry, dict) and isinstance(entry.get('name') or entry.get('folder'), str):
            index, name = entry.get('index', position), entry.get('name') or entry['folder']
        else:
            raise RecipeError(f'{where}: entry {position} ({json.dumps(entry)[:80]}) is neither a name nor '
                              'an object with "name" or "folder"')
        if not isinstance(index, int) or isinstance(index, bool) or index in by_index:
            raise RecipeError(f'{where}: entry {position} has index {index!r}, expected a whole number given once')
        by_index[index] = name
    if sorted(by_index) != list(range(len(by_index))):
        raise RecipeError(f'{where}: the indices are not 0 to {len(by_index) - 1}, each once')
    return [by_index[i] for i in range(len(by_index))]


def text_names(text, where):
    lines = [line.rstrip('\r') for line in text.split('\n') if line.strip()]
    if not lines:
        raise RecipeError(f'{where} is empty; accepted: {FORMATS}')
    if all('\t' in line for line in lines):
        pairs = [line.split('\t', 1) for line in lines]
    elif all(WORDNET_LINE.match(line) for line in lines):
        pairs = [line.split(' ', 1) for line in lines]
    else:
        return [line.strip() for line in lines]
    names = {}
    for folder, name in pairs:
        if folder in names:
            raise RecipeError(f'{where}: folder {folder!r} is listed twice')
        names[folder] = name.strip() or folder
    return [names[folder] for folder in sorted(names)]


def keep_with_run(path, names, source):
    """The class `names` a training run keeps in its workspace (`path`: its classes.json, prepare_dataset.py's
    format), so that val, pred, export and the review name the classes of its weights without the data: written
    when the workspace has none; a run that continues the workspace must name the same classes (RecipeError naming
    the first difference and `source`, where this run's names come from). Safe on every worker at once: the file
    is written atomically, and compared by each."""
    if not os.path.exists(path):
        files.write_json(path, {'classes': [{'index': i, 'name': name} for i, name in enumerate(names)]})
        return
    kept = read_names(path, None, flag='the workspace\'s')
    if kept == list(names):
        return
    if len(kept) != len(names):
        difference = f'it names {len(kept)} classes, {source} {len(names)}'
    else:
        index = next(i for i, (a, b) in enumerate(zip(kept, names)) if a != b)
        difference = f'class {index} is {kept[index]!r} there, {names[index]!r} in {source}'
    raise RecipeError(f'the workspace\'s {path} names other classes than this run ({difference}): a run keeps the '
                      'classes it started with. Give the same names (--classes, or the dataset\'s classes.json), or '
                      'a new --workspace')
