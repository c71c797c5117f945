#!/usr/bin/env bash
# Convert raw ImageNet (RAW/train/<synset>/*.JPEG and RAW/val/<synset>/*.JPEG, as docs/data.md's download steps
# leave them) into OUT/{train,val}.{lst,rec,idx} and OUT/classes.json with human-readable class names.
#
#   scripts/prepare_imagenet.sh RAW OUT
#
# JPEG bytes are stored unchanged ("pass-through"): the recipe's accuracy assumes no re-encoding or resizing.
set -euo pipefail
if [ "$#" -ne 2 ]; then
    echo "usage: $0 <path to raw imagenet> <path where processed dataset will be created>" >&2
    exit 1
fi
here="$(cd "$(dirname "$0")" && pwd)"
names="$(mktemp)"
trap 'rm -f "$names"' EXIT
# imagenet_classes.txt lines are "<synset> <names>"; prepare_dataset.py wants "<folder><TAB><name>".
sed 's/ /\t/' "$here/../rn50/data/imagenet_classes.txt" > "$names"
"${PYTHON:-python}" "$here/prepare_dataset.py" "$1" "$2" --splits train,val --names "$names"
echo "Dataset was prepared successfully in $2"
