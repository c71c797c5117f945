"""The random-resized-crop windows of DALI's training pipeline, drawn in numpy rather than by DALI's own
sampler, so that batch k of an epoch is the same whether the epoch started at 0 or was resumed at k: each
image's size read from its encoded header, and the windows drawn by the rule of DALI's random crop. dali.py's
Feed calls, per batch:

    sizes = np.array([crop_windows.image_size(jpeg) or (1000, 1000) for jpeg in jpegs], dtype=np.float64)
    anchors, shapes = crop_windows.random_crops(sizes, rng, preset.area, preset.aspect_ratio)   # relative

and hands the anchors and shapes to the pipeline (decoders.image_slice, or fn.slice after the decoder).
"""
import struct

import numpy as np

CROP_ATTEMPTS = 10

JPEG_SOF = {0xc0, 0xc1, 0xc2, 0xc3, 0xc5, 0xc6, 0xc7, 0xc9, 0xca, 0xcb, 0xcd, 0xce, 0xcf}


def image_size(encoded):
    """(height, width) from a JPEG's frame header or a PNG's IHDR, else None (the crop is then drawn for a
    square image, in relative coordinates)."""
    if encoded[:2] == b'\xff\xd8':
        position, end = 2, len(encoded) - 9
        while position < end:
            if encoded[position] != 0xff:
                position += 1
                continue
            marker = encoded[position + 1]
            if marker in JPEG_SOF:
                height, width = struct.unpack_from('>HH', encoded, position + 5)
                return (height, width) if height and width else None
            if marker == 0xff:
                position += 1
            elif marker in (0x01, 0xd8) or 0xd0 <= marker <= 0xd7:
                position += 2
            else:
                position += 2 + struct.unpack_from('>H', encoded, position + 2)[0]
        return None
    if encoded[:8] == b'\x89PNG\r\n\x1a\n' and len(encoded) >= 24:
        width, height = struct.unpack_from('>II', encoded, 16)
        return height, width
    return None


def random_crops(sizes, rng, area_range, ratio_range):
    """Relative (x, y) anchors and (w, h) shapes of random-resized-crop windows for images of `sizes`
    ((height, width) rows), by the rule of DALI's RandomCropGenerator (dali/util/random_crop_generator.cc):
    the area a uniform fraction of the image, the aspect ratio log-uniform, the first of CROP_ATTEMPTS
    rounded draws that fits in pixels with its rounded aspect ratio in range; else the whole image with its
    aspect ratio clamped to the range and shrunk to the largest allowed area. Either window is placed at a
    uniformly drawn position (DALI places the fallback at random too, not centred). Always draws the same
    amount of randomness per image."""
    height, width = sizes[:, 0:1], sizes[:, 1:2]
    low, high = ratio_range
    area = rng.uniform(*area_range, (len(sizes), CROP_ATTEMPTS)) * height * width
    ratio = np.exp(rng.uniform(np.log(low), np.log(high), (len(sizes), CROP_ATTEMPTS)))
    crop_w = np.maximum(1, np.round(np.sqrt(area * ratio)))
    crop_h = np.maximum(1, np.round(np.sqrt(area / ratio)))
    drawn_ratio = crop_w / crop_h
    fits = (crop_w <= width) & (crop_h <= height) & (drawn_ratio >= low) & (drawn_ratio <= high)
    first = fits.argmax(axis=1)
    rows = np.arange(len(sizes))
    height, width = height[:, 0], width[:, 0]
    aspect = width / height
    whole_w = np.where(aspect > high, np.maximum(1, np.floor(height * high)), width)
    whole_h = np.where(aspect < low, np.maximum(1, np.floor(width / low)), height)
    shrink = np.sqrt(np.minimum(1, area_range[1] * height * width / (whole_w * whole_h)))
    whole_w, whole_h = np.maximum(1, np.floor(whole_w * shrink)), np.maximum(1, np.floor(whole_h * shrink))
    found = fits[rows, first]
    crop_w = np.where(found, crop_w[rows, first], whole_w)
    crop_h = np.where(found, crop_h[rows, first], whole_h)
    position = rng.uniform(0, 1, (len(sizes), 2))
    x = np.floor(position[:, 0] * (width - crop_w + 1))
    y = np.floor(position[:, 1] * (height - crop_h + 1))
    anchors = np.stack([x / width, y / height], axis=1).astype(np.float32)
    shapes = np.stack([crop_w / width, crop_h / height], axis=1).astype(np.float32)
    return anchors, shapes
