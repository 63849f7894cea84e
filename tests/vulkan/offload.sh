#!/bin/sh
# Offload on vulkan gives the image of no offload, bit for bit: one tiny FLUX.1 picture per
# offload level, compared byte for byte.
# usage: offload.sh DIFFUSE TINY_MODEL_DIR TMP_DIR
set -e
diffuse=$1 model=$2 tmp=$3
run() { # $1 offload, $2 mode
    "$diffuse" generate -m "$model" -p "a red cube on a table" -W 64 -H 64 --steps 2 --seed 7 --max-sequence-length 32 \
        --device vulkan --offload "$1" --mode "$2" -o "$tmp/vk-offload-$1-$2.png" >/dev/null
}
run none eager
for level in model sequential; do
    run "$level" eager
    cmp "$tmp/vk-offload-none-eager.png" "$tmp/vk-offload-$level-eager.png"
done
echo "vulkan offload: none, model and sequential give the same image"
