#!/usr/bin/env bash
# Fine-tuning against training from scratch, on a new task made from the demo digits: even vs odd digits
# (2 classes) with only PER_CLASS training images per class. Needs the demo model (`make demo` first).
#
#   scripts/finetune_demo.sh [DEMO_RUN] [OUT]     (defaults: runs/demo runs/finetune; PER_CLASS=20, EPOCHS=8)
#
# Both runs use the same seed, schedule, data and flags; the fine-tuned one starts from the demo's
# model_best.params (its 10-class classifier replaced by a new 2-class one) with the backbone at a tenth
# of the learning rate. Prints the validation top-1 of every epoch of both.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_RUN=${1:-runs/demo}
OUT=${2:-runs/finetune}
PER_CLASS=${PER_CLASS:-20}
EPOCHS=${EPOCHS:-8}
PYTHON=${PYTHON:-python}
export PYTHON
if [ ! -f "$DEMO_RUN/model_best.params" ]; then
    echo "error: $DEMO_RUN/model_best.params not found: run make demo first" >&2
    exit 2
fi
DATA="$OUT/data"
if [ ! -f "$DATA/rec/val.idx" ]; then
    "$PYTHON" scripts/make_demo_dataset.py "$DATA/images" --task parity --train-per-class "$PER_CLASS"
    "$PYTHON" scripts/prepare_dataset.py "$DATA/images" "$DATA/rec" --names "$DATA/images/names.txt"
fi
COMMON=(-n 1 -b 10 -e "$EPOCHS" -l 0.256 --dtype float32 --data-root "$DATA/rec" --image-shape 3,32,32
        --num-classes 2 --data-val-resize 36 --min-random-area 0.5 --warmup-epochs 1 --seed 1 --save-frequency 0)
rm -rf "$OUT/scratch" "$OUT/finetuned"
./runner "${COMMON[@]}" --workspace "$OUT/scratch"
./runner "${COMMON[@]}" --workspace "$OUT/finetuned" --load "$DEMO_RUN/model_best.params" --finetune \
    --backbone-lr-mult 0.1
"$PYTHON" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {name: json.load(open(f'{out}/{name}/report.json'))['epochs'] for name in ('scratch', 'finetuned')}
print('epoch  scratch top-1  fine-tuned top-1')
for a, b in zip(runs['scratch'], runs['finetuned']):
    print(f'{a["epoch"]:5d}  {a["val.accuracy"]:13.4f}  {b["val.accuracy"]:16.4f}')
PY
