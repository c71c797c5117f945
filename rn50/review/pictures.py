"""The review's pictures, as encoded bytes: matplotlib (Agg, no display) draws the curves, the confusion matrix,
the per-class accuracy histogram and the reliability diagram as PNG; Pillow lays out sheets of images with their
captions as JPEG.

    png = drawn('the curves', curves_png, steps, epochs)   # None, and one log line, if it cannot be drawn
    jpeg = drawn('the worst images', sheet_jpeg, tiles, captions)

A picture that cannot be drawn (no font, a class name a renderer rejects, a library error) never stops a run:
`drawn` says so in one warning line and returns None; the figures stay in report.json.

The curves, the histogram and the reliability diagram have fixed margins: their labels are fixed words and their
tick labels numbers of at most 7 characters, which fit. matplotlib's tight_layout measured every text before the
drawing measured it again, 30 to 50% of their time (0.6 s of every review, docs/performance.md); the confusion
matrix, labelled with the classes' names, keeps it, once (savefig drew it a second time to lay it out again:
0.16 s of CPU a matrix of 10 classes before, 0.125 s after, the same bytes).
"""
import io
import logging

import numpy as np

log = logging.getLogger(__name__)

# A confusion matrix is drawn up to this many classes; beyond, the page shows the most-confused pairs and the
# histogram of per-class accuracy (a 1000x1000 picture says nothing).
MATRIX_CLASSES = 40
TILE = 160            # the side of a sheet's image, in pixels (small images are enlarged to it)
COLUMNS = 4


def drawn(what, draw, *args, **kwargs):
    """draw(*args, **kwargs), or None with a warning naming `what` when it fails."""
    try:
        return draw(*args, **kwargs)
    except Exception as e:  # any failure of a drawing library: the run goes on without that picture
        log.warning('Could not draw %s (%s: %s); its figures are in the report\'s JSON', what, type(e).__name__,
                    str(e).splitlines()[0][:200] if str(e) else '')
        return None


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')       # no display needed: files only
    from matplotlib import pyplot
    return pyplot


def _png(figure):
    pyplot = _pyplot()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format='png', dpi=100)
    finally:
        pyplot.close(figure)
    return buffer.getvalue()


def _plain_text():
    """matplotlib's settings for text as given: a class name with `$` is not TeX."""
    import matplotlib
    return matplotlib.rc_context({'text.parse_math': False})


def curves_png(steps, epochs):
    """Loss (per logged window and per epoch, train and val), top-1 and top-5 (val), the learning rate (per
    logged window) and images/s (per epoch, train and val) over epochs. `steps`: (epoch + fraction, {metric:
    value}) of the DLLogger windows; `epochs`: the history, {metric: value, 'epoch': n} each."""
    pyplot = _pyplot()
    with _plain_text():
        figure, axes = pyplot.subplots(1, 4, figsize=(16, 3.6))
        loss, accuracy, rate, speed = axes

        def plot(axis, points, key, label, **style):
            pairs = [(x, m[key]) for x, m in points if m.get(key) is not None]
            if pairs:
                axis.plot(*zip(*pairs), label=label, **style)

        windows = [(x, m) for x, m in steps]
        ends = [(m['epoch'] + 1, m) for m in epochs]
        plot(loss, windows, 'train.loss', 'train (logged windows)', color='tab:blue', alpha=0.35, linewidth=1)
        plot(loss, ends, 'train.loss', 'train (epoch)', color='tab:blue', marker='o')
        plot(loss, ends, 'val.loss', 'val', color='tab:orange', marker='o')
        plot(accuracy, ends, 'val.accuracy', 'val top-1', color='tab:orange', marker='o')
        plot(accuracy, ends, 'val.top_k_accuracy_5', 'val top-5', color='tab:green', marker='o')
        plot(rate, windows, 'train.lr', 'learning rate', color='tab:purple')
        plot(speed, ends, 'train.ips', 'train', color='tab:blue', marker='o')
        plot(speed, ends, 'val.ips', 'val', color='tab:orange', marker='o')
        for axis, title in ((loss, 'loss'), (accuracy, 'accuracy'), (rate, 'learning rate'), (speed, 'images/s')):
            axis.set_title(title)
            axis.set_xlabel('epoch')
            axis.grid(alpha=0.3)
            if axis.get_legend_handles_labels()[0]:
                axis.legend(fontsize=8)
        figure.subplots_adjust(left=0.04, right=0.99, bottom=0.14, top=0.91, wspace=0.22)
        return _png(figure)


def confusion_png(matrix, names):
    """The confusion matrix (rows: true class, columns: top-1 class), coloured by the share of each true class's
    images, with the counts written in the cells when there are few classes."""
    pyplot = _pyplot()
    classes = len(names)
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    side = min(4 + 0.35 * classes, 16)
    with _plain_text():
        figure, axis = pyplot.subplots(figsize=(side + 1.5, side))
        image = axis.imshow(shares, cmap='Blues', vmin=0, vmax=1)
        figure.colorbar(image, ax=axis, fraction=0.046, label='share of the true class')
        axis.set_xticks(range(classes), [short(n) for n in names], rotation=90, fontsize=8)
        axis.set_yticks(range(classes), [short(n) for n in names], fontsize=8)
        axis.set_xlabel('predicted (top-1)')
        axis.set_ylabel('true')
        if classes <= 20:
            for (true, predicted), count in np.ndenumerate(matrix):
                if count:
                    axis.text(predicted, true, str(count), ha='center', va='center', fontsize=8,
                              color='white' if shares[true, predicted] > 0.5 else 'black')
        figure.tight_layout()
        figure.set_layout_engine(None)   # laid out once: savefig would draw it a second time to lay it out again
        return _png(figure)


def class_accuracy_png(top1):
    """The histogram of the classes' top-1 accuracy (one count per class)."""
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(6, 3.6))
    axis.hist(top1, bins=np.linspace(0, 1, 21), color='tab:blue', edgecolor='white')
    axis.set_xlabel('top-1 accuracy of a class')
    axis.set_ylabel('classes')
    axis.grid(alpha=0.3)
    figure.subplots_adjust(left=0.11, right=0.97, bottom=0.15, top=0.95)
    return _png(figure)


def reliability_png(calibration):
    """The reliability diagram: each confidence bin's accuracy against its mean confidence (a calibrated model
    lies on the diagonal), with the bins' image counts below."""
    pyplot = _pyplot()
    bins = calibration['reliability']
    centres = [(b['lower'] + b['upper']) / 2 for b in bins]
    width = bins[0]['upper'] - bins[0]['lower']
    figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(5, 5.5), sharex=True,
                                            gridspec_kw={'height_ratios': [3, 1]})
    top.bar(centres, [b['accuracy'] or 0 for b in bins], width=width * 0.95, color='tab:blue', label='accuracy')
    top.plot([0, 1], [0, 1], '--', color='gray', label='calibrated')
    top.set_ylabel('accuracy')
    top.set_title(f'ECE {calibration["ece"]:.3f} ({calibration["bins"]} bins)')
    top.legend(fontsize=8, loc='upper left')
    bottom.bar(centres, [b['images'] for b in bins], width=width * 0.95, color='tab:gray')
    bottom.set_xlabel('confidence (top-1 probability)')
    bottom.set_ylabel('images')
    bottom.set_xlim(0, 1)
    figure.subplots_adjust(left=0.16, right=0.97, bottom=0.09, top=0.94, hspace=0.08)
    return _png(figure)


def short(name, length=24):
    return name if len(name) <= length else name[:length - 1] + '\u2026'


def sheet_jpeg(tiles, captions, columns=COLUMNS):
    """A sheet of `tiles` (uint8 HxWx3 arrays) in a grid, each enlarged to TILE pixels (nearest neighbour, so small
    images stay sharp) with its caption lines below."""
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.load_default()
    lines = max(len(c) for c in captions)
    line_height = 13
    cell_width, cell_height = TILE + 8, TILE + 8 + lines * line_height
    rows = -(-len(tiles) // columns)
    sheet = Image.new('RGB', (cell_width * min(columns, len(tiles)), cell_height * rows), 'white')
    draw = ImageDraw.Draw(sheet)
    for n, (tile, caption) in enumerate(zip(tiles, captions)):
        x, y = (n % columns) * cell_width + 4, (n // columns) * cell_height + 4
        image = Image.fromarray(tile)
        scale = TILE / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.NEAREST if scale >= 1 else Image.BILINEAR)
        sheet.paste(image, (x, y))
        for k, text in enumerate(caption):
            draw.text((x, y + TILE + 2 + k * line_height), fitted(draw, text, font, TILE), fill='black', font=font)
    buffer = io.BytesIO()
    sheet.save(buffer, format='JPEG', quality=90)
    return buffer.getvalue()


def fitted(draw, text, font, width):
    """`text` shortened with an ellipsis until it fits `width` pixels."""
    while len(text) > 1 and draw.textlength(text, font=font) > width:
        text = text[:-2] + '\u2026'
    return text


def displayable(images, mean, std, layout):
    """Network inputs back to pictures: (N, H, W, 3) uint8 from normalised `images` ((N, C, H, W) or (N, H, W, C)
    per `layout`, 3 or 4 channels, float16 or float32) and the normalisation's `mean` and `std` (0-255 scale)."""
    images = np.asarray(images, np.float32)
    if layout == 'NCHW':
        images = images.transpose(0, 2, 3, 1)
    images = images[..., :3] * np.asarray(std, np.float32) + np.asarray(mean, np.float32)
    return np.clip(np.rint(images), 0, 255).astype(np.uint8)
