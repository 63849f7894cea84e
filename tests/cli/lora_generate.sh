#!/bin/sh
# `diffuse generate --lora FILE[:SCALE]` on the tiny FLUX.1 folder: an adapter changes the
# image, a scale of 0 gives the image without it bit for bit, two --lora options load,
# offloading (merged copies; int8's unmerged factors) leaves the image as it is, and
# bad adapters and arguments are refused with one message naming the file or the option.
# `diffuse inspect` says what an adapter file is.
# Usage: lora_generate.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
diffuse=$1
golden=$2
cases=$3
work=$4/lora-$$
failures=0
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
model=$golden/t2i-flux-schnell/pipeline
peft=$cases/lora-flux-peft
gen() { # output, then extra options
    out=$1; shift
    "$diffuse" generate -m "$model" -p "a fox" -W 64 -H 64 --steps 2 --seed 3 --threads 2 \
        -o "$work/$out" --dtype f32 "$@" >"$work/log" 2>&1
}

gen base.png || { fail "generate:"; cat "$work/log"; }
gen a.png --lora "$peft/a.safetensors" || { fail "--lora:"; cat "$work/log"; }
gen a0.png --lora "$peft/a.safetensors:0" || { fail "--lora FILE:0:"; cat "$work/log"; }
gen ab.png --lora "$peft/a.safetensors:0.8" --lora "$peft/b.safetensors:-0.6" ||
    { fail "two --lora:"; cat "$work/log"; }
gen ab-off.png --lora "$peft/a.safetensors:0.8" --lora "$peft/b.safetensors:-0.6" \
    --offload sequential || { fail "--offload sequential with --lora:"; cat "$work/log"; }
gen a8.png --dtype int8 --lora "$peft/a.safetensors" || { fail "int8 --lora:"; cat "$work/log"; }
gen a8-off.png --dtype int8 --lora "$peft/a.safetensors" --offload model ||
    { fail "int8 --lora --offload model:"; cat "$work/log"; }
cmp -s "$work/base.png" "$work/a.png" && fail "the adapter did not change the image" ||
    echo "ok   an adapter changes the image"
cmp -s "$work/base.png" "$work/a0.png" && echo "ok   scale 0 is the image without it" ||
    fail "--lora FILE:0 differs from no adapter"
cmp -s "$work/a.png" "$work/ab.png" && fail "a second adapter changed nothing" ||
    echo "ok   two adapters load and change the image again"
cmp -s "$work/ab.png" "$work/ab-off.png" && echo "ok   merged copies survive sequential offload" ||
    fail "--offload sequential changed the image with adapters"
cmp -s "$work/a8.png" "$work/a8-off.png" &&
    echo "ok   unmerged (int8) adapters survive model offload" ||
    fail "--offload model changed the int8 image with an adapter"

# refusals: one line naming the file or the option
if gen bad.png --lora "$work/missing.safetensors"; then
    fail "a missing adapter was accepted"
elif grep -q "missing.safetensors" "$work/log"; then
    echo "ok   a missing adapter file is named"
else
    fail "missing adapter message:"; cat "$work/log"
fi
if gen bad.png --lora "$golden/t2i-flux-schnell/pipeline/vae/diffusion_pytorch_model.safetensors"; then
    fail "a VAE checkpoint was accepted as an adapter"
elif grep -q "is not a LoRA tensor" "$work/log"; then
    echo "ok   a file that is not an adapter is refused naming a key"
else
    fail "non-adapter message:"; cat "$work/log"
fi
if gen bad.png --lora ""; then
    fail "--lora '' was accepted"
else
    echo "ok   an empty --lora is a usage error"
fi

"$diffuse" inspect -s "$cases/lora-flux-kohya/kohya.safetensors" >"$work/inspect" 2>&1
grep -q "recognised: LoRA adapter, kohya layout" "$work/inspect" &&
    echo "ok   inspect names the kohya layout" || { fail "inspect:"; cat "$work/inspect"; }

cmp -s "$work/a.png" "$work/a8.png" && fail "--dtype int8 gave the f32 image" || echo "ok   the int8 run is its own"
rm -rf "$work"
[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
