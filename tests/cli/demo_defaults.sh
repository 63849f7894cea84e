#!/bin/sh
# `diffuse generate` takes its defaults from the model folder: the demo pipeline
# (models/demo: VAE sample_size 64, tokenizer_2 model_max_length 64) drawn with no size or
# token options gives the image of -W 64 -H 64 --max-sequence-length 64, bit for bit, and
# not that of 512 T5 tokens; a make-tiny FLUX.1 folder (VAE sample_size 256) gives 256x256.
# Usage: demo_defaults.sh PATH/TO/diffuse MODEL_DIR WORK_DIR
set -u
diffuse=$1
model=$2
work=$3/demo-defaults-$$
failures=0
prompt="a red circle on a blue background"
rm -rf "$work" && mkdir -p "$work" || exit 1

run() { # run NAME ARGS...: generate into $work/NAME.png, quietly
    name=$1; shift
    if ! "$diffuse" generate -p "$prompt" --seed 42 --threads 2 -o "$work/$name.png" "$@" \
            >"$work/$name.log" 2>&1; then
        echo "FAIL generate $*:"; cat "$work/$name.log"; failures=$((failures + 1))
    fi
}
size_is() { # size_is NAME WxH
    if "$diffuse" info "$work/$1.png" | head -n 1 | grep -q ": $2 RGB\$"; then
        echo "ok   $1 is $2"
    else
        echo "FAIL $1: $("$diffuse" info "$work/$1.png" | head -n 1), not $2"
        failures=$((failures + 1))
    fi
}

"$diffuse" generate --help >"$work/help" 2>&1
grep -q "vae/config.json's sample_size" "$work/help" && grep -q "model_max_length" \
    "$work/help" && echo "ok   --help names the folder's defaults" ||
    { echo "FAIL --help does not name the folder's defaults"; failures=$((failures + 1)); }

run bare -m "$model"
run explicit -m "$model" -W 64 -H 64 --max-sequence-length 64 --steps 4
run seq512 -m "$model" --max-sequence-length 512
size_is bare 64x64
if cmp -s "$work/bare.png" "$work/explicit.png"; then
    echo "ok   no options = -W 64 -H 64 --max-sequence-length 64 --steps 4"
else
    echo "FAIL the bare command's image differs from the explicit one's"
    failures=$((failures + 1))
fi
if cmp -s "$work/bare.png" "$work/seq512.png"; then
    echo "FAIL 512 T5 tokens draw the same image: the token default is not the folder's"
    failures=$((failures + 1))
else
    echo "ok   --max-sequence-length 512 draws another image"
fi

if "$diffuse" make-tiny --arch flux "$work/tiny" >/dev/null 2>&1; then
    run tiny -m "$work/tiny" --steps 1
    size_is tiny 256x256
else
    echo "FAIL make-tiny --arch flux"; failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] && rm -rf "$work"
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
