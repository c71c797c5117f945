#!/usr/bin/env bash
# The demo behind `make demo`: build the digits dataset (real images, no network), convert it to RecordIO,
# train ResNet-50 v1.5 on it through the runner on this machine, and say where everything is.
#
#   scripts/demo.sh [DATA_DIR] [RUN_DIR]      (defaults: data/demo runs/demo; `make demo` passes them)
#
# Every step is idempotent: an existing dataset is reused, and training resumes from RUN_DIR's last state
# (a finished run just reports again). Extra runner flags can be given in DEMO_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-data/demo}
RUN=${2:-runs/demo}
PYTHON=${PYTHON:-python}
export PYTHON

if [ ! -f "$DATA/rec/val.idx" ]; then
    "$PYTHON" scripts/make_demo_dataset.py "$DATA/images"
    "$PYTHON" scripts/prepare_dataset.py "$DATA/images" "$DATA/rec" --names "$DATA/images/names.txt"
fi

# 10 classes of 32x32 digits: a small image shape, 10 output classes, validation resized to 36 (the recipe's
# 224/256 crop ratio), and training crops of at least half the image (smaller crops of a centred digit no
# longer show it); everything else is the recipe's ResNet-50 v1.5 with its schedule, label smoothing and
# augmentation.
./runner -n 1 -b 32 -e 15 -l 0.256 --dtype float32 --data-root "$DATA/rec" \
    --image-shape 3,32,32 --num-classes 10 --data-val-resize 36 --min-random-area 0.5 --warmup-epochs 2 \
    --workspace "$RUN" --save-frequency 5 --seed 1 ${DEMO_FLAGS:-}

echo
echo "Demo finished. Outputs in $RUN:"
echo "  report.html            what the model learned: curves, per class, confusion, worst images, the"
echo "                         first training batch, calibration (open it in a browser)"
echo "  report.json            per-epoch metrics, the review's figures, configuration, versions, hardware"
echo "  dllogger_log.log       DLLogger JSON lines;  log.log  the human-readable log"
echo "  model_best.params      best weights;  model_last.state  full state for resuming"
echo "Classify an image (the run's size and classes come from its state and classes.json):"
echo "  ./runner --mode pred --workspace $RUN --data-root $DATA/rec --data-pred $DATA/images/val/digit_3"
