#!/usr/bin/env bash
# What each piece of torchvision's and timm's recipes gives on the digits demo: the demo's training command,
# once without any piece (twice: seeds 1 and 2, the spread of a seed) and once with each piece alone, one run
# after the other; then the test-time flip on the plain run's last weights, and distillation from them. Prints the
# final and best top-1 of every run, its training images/s, and the weight average's top-1 where there is one.
#
#   scripts/demo_pieces.sh [DATA_DIR] [OUT]    (defaults: data/demo runs/pieces; NET_FLAGS="--num-layers 18",
#                                               EPOCHS=10; PIECES="ta_wide erase" runs only those pieces)
#
# The dataset is the demo's (built as `make demo` builds it when missing). ResNet-18 by default, so that the
# dozen runs fit in half an hour on 2 cores; NET_FLAGS="" runs the demo's ResNet-50.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-data/demo}
OUT=${2:-runs/pieces}
NET_FLAGS=${NET_FLAGS---num-layers 18}
EPOCHS=${EPOCHS:-10}
PYTHON=${PYTHON:-python}
export PYTHON
if [ ! -f "$DATA/rec/val.idx" ]; then
    "$PYTHON" scripts/make_demo_dataset.py "$DATA/images"
    "$PYTHON" scripts/prepare_dataset.py "$DATA/images" "$DATA/rec" --names "$DATA/images/names.txt"
fi
# The demo's command (scripts/demo.sh), without .params checkpoints (the last state is the weights used).
COMMON=(-n 1 -b 32 -e "$EPOCHS" -l 0.256 --dtype float32 --data-root "$DATA/rec" --image-shape 3,32,32
        --num-classes 10 --data-val-resize 36 --min-random-area 0.5 --warmup-epochs 2 --save-frequency 0
        $NET_FLAGS)

declare -A FLAGS=(
    [plain]="--seed 1"
    [plain-seed2]="--seed 2"
    [ta_wide]="--seed 1 --auto-augment ta_wide"
    [randaugment]="--seed 1 --auto-augment ra"
    [erase]="--seed 1 --random-erase 0.25"
    [repeats]="--seed 1 --aug-repeats 4"
    [train28-test32]="--seed 1 --image-shape 3,28,28 --val-image-shape 3,32,32"
    [progressive]="--seed 1 --progressive-size 24 --progressive-step 4"
    [drop-path]="--seed 1 --drop-path 0.05"
    [bce]="--seed 1 --bce-loss --bce-target-thresh 0.2"
    [ema]="--seed 1 --model-ema --model-ema-decay 0.98 --model-ema-warmup"
    [distill]="--seed 1 --teacher $OUT/plain/model_last.state --kd-alpha 0.5 --kd-temperature 4"
)
ORDER="plain plain-seed2 ta_wide randaugment erase repeats train28-test32 progressive drop-path bce ema distill"
for piece in ${PIECES:-$ORDER}; do
    rm -rf "${OUT:?}/$piece"
    # shellcheck disable=SC2086
    ./runner "${COMMON[@]}" ${FLAGS[$piece]} --workspace "$OUT/$piece" > "$OUT.$piece.out" 2>&1 ||
        { echo "error: the $piece run failed: see $OUT.$piece.out" >&2; exit 1; }
    echo "$piece done"
done
if [ -f "$OUT/plain/model_last.state" ]; then
    ./runner --mode val --workspace "$OUT/plain" --data-root "$DATA/rec" --tta flip $NET_FLAGS \
        > "$OUT.flip.out" 2>&1 || { echo "error: the flip validation failed: see $OUT.flip.out" >&2; exit 1; }
fi

"$PYTHON" - "$OUT" ${PIECES:-$ORDER} <<'PY'
import json, os, sys
out, pieces = sys.argv[1], sys.argv[2:]
print('| run | final top-1 | best top-1 (epoch) | average\'s best top-1 | training images/s |')
print('|---|---|---|---|---|')
for piece in pieces:
    with open(f'{out}/{piece}/report.json') as f:
        run = json.load(f)
    last, summary = run['epochs'][-1], run['summary']
    ema = f"{summary['val.ema.accuracy']:.3f}" if 'val.ema.accuracy' in summary else ''
    print(f"| {piece} | {last['val.accuracy']:.3f} | "
          f"{summary['val.accuracy']:.3f} ({summary['val.accuracy.epoch']}) | {ema} | {summary['train.ips']:.0f} |")
flip = f'{out}/plain/report_val.json'
if os.path.exists(flip):
    with open(flip) as f:
        print(f"| plain, last weights, --mode val --tta flip | {json.load(f)['epochs'][-1]['val.accuracy']:.3f} | | | |")
PY
