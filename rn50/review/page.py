"""The review as one HTML page (report.html of a training run, report_val.html of --mode val): the figures of
outcomes.review_figures, the pictures of pictures.py (embedded as data: URIs, so the one file opens offline in any
browser and can be mailed), the run's configuration and versions. Written atomically.

    write_page(workspace.place('report.html'), Page(title, facts, review, pictures, config, versions))
"""
import base64
import dataclasses
import html

from rn50 import files
from rn50.review import pictures as drawing

# Up to this many classes the page lists every class; beyond, the 25 worst, with the whole table folded away.
LISTED_CLASSES = 100
STYLE = '''body{font-family:sans-serif;margin:1.5em;max-width:1300px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f0f0f0}td.name,th.name{text-align:left}img{max-width:100%;border:1px solid #ddd}
.note{color:#555;font-size:13px}h2{border-bottom:1px solid #ddd;padding-bottom:2px;margin-top:1.5em}'''


@dataclasses.dataclass(frozen=True)
class Page:
    """What the page shows: its `title`, `facts` (label -> value lines at the top), the `review` (report.json's
    "review", or None when no validation ran), `images` ({name: PNG or JPEG bytes, None where a picture could not
    be drawn}: 'curves', 'confusion', 'class_accuracy', 'reliability', 'worst', 'training_batch'), the resolved
    `config`, the `versions` and the `hardware`."""
    title: str
    facts: tuple = ()
    review: dict = None
    images: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    hardware: dict = dataclasses.field(default_factory=dict)


def write_page(path, page):
    """page_html(page) to `path`, atomically."""
    with files.atomic_path(path) as tmp, open(tmp, 'w', encoding='utf-8') as f:
        f.write(page_html(page))


def page_html(page):
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(page.title)}</title>'
             f'<style>{STYLE}</style></head><body><h1>{e(page.title)}</h1>',
             table(['', ''], page.facts, header=False)]
    if 'curves' in page.images:
        parts += ['<h2>Curves</h2>', picture(page.images, 'curves', 'loss, accuracy, learning rate and images/s '
                                                                   'per epoch')]
    if page.review:
        parts += review_sections(page.review, page.images)
    else:
        parts.append('<p class="note">No validation ran: no per-class figures, worst images or calibration.</p>')
    if 'training_batch' in page.images:
        parts += ['<h2>The first training batch</h2>', '<p class="note">After augmentation, as the network sees it '
                  '(before mixup or cutmix, which the training step applies), labelled with its classes.</p>',
                  picture(page.images, 'training_batch', 'the first training batch')]
    parts += ['<h2>Configuration</h2>', table(['flag', 'value'], sorted(page.config.items()), text=(0, 1)),
              '<h2>Versions and hardware</h2>',
              table(['', ''], list(page.versions.items()) + list(page.hardware.items()), header=False),
              '</body></html>']
    return '\n'.join(parts)


def review_sections(review, images):
    names = {c['class']: c['name'] for c in review['per_class']}
    calibration = review['calibration']
    trusted = calibration['trusted_from']
    parts = ['<h2>Per class</h2>', class_table(review['per_class'])]
    if review['num_classes'] <= drawing.MATRIX_CLASSES:
        parts += ['<h2>Confusion matrix</h2>', picture(images, 'confusion', 'the confusion matrix')]
    parts += ['<h2>Top-1 accuracy of the classes</h2>', picture(images, 'class_accuracy', 'per-class accuracy'),
              '<h2>Most confused</h2>',
              table(['true', 'predicted', 'images'], [(names[m['true']], names[m['predicted']], m['images'])
                                                       for m in review['most_confused']], text=(0, 1))
              if review['most_confused'] else '<p class="note">No image was misclassified.</p>',
              f'<h2>The {len(review["worst"])} worst images</h2>',
              '<p class="note">The highest losses, as the network saw them (the validation crop). Look for wrong '
              'labels, and for objects the crop cut away.</p>',
              picture(images, 'worst', 'the worst validation images'),
              table(['file', 'true', 'p(true)', 'predicted', 'p(predicted)', 'loss'],
                    [(w.get('file') or f'record {w["record"]}', w['true_name'], percent(w['true_probability']),
                      w['predicted_name'], percent(w['predicted_probability']), f'{w["loss"]:.3f}')
                     for w in review['worst']], text=(0, 1, 3)),
              '<h2>Calibration</h2>',
              f'<p>Expected calibration error: {calibration["ece"]:.4f} over {calibration["bins"]} bins. ' + (
                  f'At a top-1 probability of {percent(trusted["confidence"])} or more the model is right '
                  f'{percent(trusted["accuracy"])} of the time ({trusted["images"]} of {review["images"]} images, '
                  f'{percent(trusted["share"])}): the threshold for {percent(calibration["target_accuracy"])}.'
                  if trusted else f'No confidence threshold gives {percent(calibration["target_accuracy"])} '
                  'accuracy on this validation set.') + '</p>',
              picture(images, 'reliability', 'the reliability diagram')]
    return parts


def class_table(classes):
    rows = [(c['class'], c['name'], percent(c['precision']), percent(c['recall']), f'{c["f1"]:.3f}', c['support'],
             percent(c['top1']), percent(c['top5'])) for c in classes]
    columns = ['class', 'name', 'precision', 'recall', 'F1', 'images', 'top-1', 'top-5']
    if len(rows) <= LISTED_CLASSES:
        return table(columns, rows, text=(1,))
    worst = sorted(range(len(classes)), key=lambda c: (classes[c]['top1'], c))[:25]
    return ('<p class="note">The 25 classes of lowest top-1:</p>' + table(columns, [rows[c] for c in worst], text=(1,)) +
            f'<details><summary>All {len(rows)} classes</summary>{table(columns, rows, text=(1,))}</details>')


def picture(images, name, description):
    data = images.get(name)
    if data is None:
        return f'<p class="note">({description} could not be drawn: the log says why; the figures are in the ' \
               'report\'s JSON)</p>'
    kind = 'jpeg' if data[:2] == b'\xff\xd8' else 'png'
    return f'<p><img alt="{e(description)}" src="data:image/{kind};base64,{base64.b64encode(data).decode()}"></p>'


def table(columns, rows, header=True, text=()):
    """An HTML table; the columns numbered in `text` are left-aligned, as are all of a table without a header."""
    def cell(tag, value, n):
        kind = ' class="name"' if n in text or not header else ''
        return f'<{tag}{kind}>{e(value)}</{tag}>'
    head = '<tr>' + ''.join(cell('th', c, n) for n, c in enumerate(columns)) + '</tr>' if header else ''
    body = ''.join('<tr>' + ''.join(cell('td', v, n) for n, v in enumerate(row)) + '</tr>' for row in rows)
    return f'<table>{head}{body}</table>'


def percent(value):
    return f'{100 * value:.1f}%'


def e(value):
    return html.escape(str(value))
