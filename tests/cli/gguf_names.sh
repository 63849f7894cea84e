#!/bin/sh
# GGUF files in other programs' names through `diffuse generate`: a T5 encoder GGUF in
# llama.cpp's names as --text-encoder-2 runs; when the folder has no T5 tokenizer (FLUX.1's
# tokenizer_2, SD3's tokenizer_3), the GGUF's own tokenizer (tokenizer.ggml.*, the folder's
# vocabulary) is used and gives the folder's image bit for bit, saying so in a note (SD3:
# the note, then the FLUX-sized file's refusal by shape), and a folder without it that is
# given a T5 file holding none is refused;
# stable-diffusion.cpp's GGUF of a diffusers folder's transformer and VAE in diffusers' own
# names under its prefixes (float32) runs as -m FILE --config DIR and gives the folder's
# image bit for bit as --transformer FILE --vae FILE; such a file is refused without DIR,
# saying how to give it.
# Usage: gguf_names.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 golden=$2 cases=$3
work=$4/gguf-names-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
flux=$golden/t2i-flux-schnell/pipeline
t5=$cases/te-gguf-t5-llamacpp/t5-tiny-encoder-Q8_0.gguf
args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
failures=0
. "$(dirname "$0")/expect_refusal.sh"

"$bin" generate -m "$flux" $args -o "$work/t5.png" --text-encoder-2 "$t5" 2>"$work/err" ||
    fail "llama.cpp T5 GGUF: $(cat "$work/err")"
[ -s "$work/t5.png" ] || fail "llama.cpp T5 GGUF: no image"

"$bin" generate -m "$flux" $args -o "$work/flux.png" 2>"$work/err" || fail "flux folder: $(cat "$work/err")"
sdd=$cases/pipe-flux-gguf-sdcpp/flux1-tiny-sdcpp-diffusers-f32.gguf
"$bin" generate -m "$sdd" --config "$flux" $args -o "$work/sdd.png" 2>"$work/err" ||
    fail "sd.cpp GGUF, diffusers names, -m FILE --config DIR: $(cat "$work/err")"
[ -s "$work/sdd.png" ] || fail "sd.cpp GGUF, diffusers names, -m FILE --config DIR: no image"
# (Its PNG names the file as the model, so the bytes are compared on the same -m below:
# -m FILE --config DIR sets the same two component files.)
"$bin" generate -m "$flux" --transformer "$sdd" --vae "$sdd" $args -o "$work/sdd2.png" \
    2>"$work/err" || fail "sd.cpp GGUF, diffusers names, --transformer --vae: $(cat "$work/err")"
cmp -s "$work/flux.png" "$work/sdd2.png" || fail "sd.cpp GGUF (--transformer --vae): the image differs"

# same_image WHAT SUB SRC ARGS...: a copy of SRC with its SUB/ tokenizer and one without it
# (same folder name: the PNG names it) give the same PNG with the T5 GGUF; the second says
# in a note where its tokenizer came from.
same_image() {
    what=$1 sub=$2 src=$3
    shift 3
    mkdir -p "$work/$what-tok" "$work/$what-none" || exit 1
    cp -r "$src" "$work/$what-tok/pipeline" && cp -r "$src" "$work/$what-none/pipeline" &&
        rm -f "$work/$what-none/pipeline/$sub/"* || exit 1
    "$bin" generate -m "$work/$what-tok/pipeline" $args -o "$work/$what-tok.png" "$@" \
        2>"$work/err" || fail "$what, folder tokenizer: $(cat "$work/err")"
    "$bin" generate -m "$work/$what-none/pipeline" $args -o "$work/$what-none.png" "$@" \
        2>"$work/err" || fail "$what, the GGUF's tokenizer: $(cat "$work/err")"
    grep -q "$sub: the T5 file's tokenizer (llama.cpp's tokenizer.ggml.\*) from $t5; the folder has none" \
        "$work/err" || fail "$what: no note says where the tokenizer came from: $(cat "$work/err")"
    [ -s "$work/$what-tok.png" ] && cmp -s "$work/$what-tok.png" "$work/$what-none.png" ||
        fail "$what: the GGUF's tokenizer gives another image than the folder's"
}
same_image flux tokenizer_2 "$flux" --text-encoder-2 "$t5"
same_image flux-special tokenizer_2 "$flux" --text-encoder-2 "$t5" \
    -p "a <extra_id_0> fox </s> Ｆｏｘ  ①"
# `diffuse tokenize -m FILE.gguf` gives the folder's ids.
for text in "a photo of a cat" "cat <extra_id_0>dog </s> Ｆｕｌｌ ①"; do
    "$bin" tokenize -m "$t5" -n 16 "$text" >"$work/tok-gguf" 2>"$work/err" ||
        fail "tokenize -m FILE.gguf: $(cat "$work/err")"
    "$bin" tokenize -m "$flux" -c tokenizer_2 -n 16 "$text" >"$work/tok-dir" 2>"$work/err" ||
        fail "tokenize -m DIR: $(cat "$work/err")"
    grep -q "input_ids: \[" "$work/tok-gguf" && cmp -s "$work/tok-gguf" "$work/tok-dir" ||
        fail "tokenize '$text': the GGUF gives $(cat "$work/tok-gguf"), the folder $(cat "$work/tok-dir")"
done
sd3=$golden/t2i-sd3/pipeline
# The case's T5 is FLUX's tiny one: SD3's tokenizer_3 (the same vocabulary) comes from it,
# and then its weights are refused by shape.
cp -r "$sd3" "$work/sd3-none" && rm -f "$work/sd3-none/tokenizer_3/"* || exit 1
"$bin" generate -m "$work/sd3-none" $args --guidance 2 --text-encoder-3 "$t5" \
    -o "$work/sd3.png" 2>"$work/err"
got=$?
{ [ "$got" -eq 1 ] && [ ! -e "$work/sd3.png" ] &&
    grep -q "tokenizer_3: the T5 file's tokenizer (llama.cpp's tokenizer.ggml.\*) from $t5" "$work/err" &&
    grep -q "has shape \[4224, 48\], expected \[4224, 96\]" "$work/err"; } ||
    fail "sd3 without tokenizer_3: status $got: $(cat "$work/err")"
expect "no tokenizer files" -m "$work/flux-none/pipeline" \
    --text-encoder-2 "$flux/text_encoder_2/model.safetensors"
expect "--config DIR" -m "$cases/flux-gguf-sdcpp/flux1-tiny-sdcpp-q8_0.gguf"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all ok"
[ "$failures" -eq 0 ]
