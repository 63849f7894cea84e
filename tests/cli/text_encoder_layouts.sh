#!/bin/sh
# Text encoder files in their authors' own layouts, through generate and convert: SD3's
# CLIP-G in OpenCLIP's names (te-single-clip-g-openclip, --text-encoder-2) and FLUX.2's
# Mistral in Mistral's consolidated names (te-single-mistral-consolidated, --text-encoder)
# run, and `diffuse convert` of each writes a folder in transformers' names (the transposed
# projection, the permuted wq / wk as bound) that gives the same image bit for bit.
# Usage: text_encoder_layouts.sh PATH/TO/diffuse PATH/TO/diffuse-check GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 golden=$3 cases=$4
work=$5/te-layouts-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# run NAME DIR OPTION FILE: generate with the file, convert, generate from the folder.
run() {
    name=$1 dir=$2 opt=$3 file=$4
    "$bin" generate -m "$dir" $args "$opt" "$file" -o "$work/$name.png" 2>"$work/err" ||
        fail "$name: generate: $(cat "$work/err")"
    "$bin" convert -m "$dir" "$opt" "$file" -o "$work/$name/pipeline" --threads 2 \
        >/dev/null 2>"$work/err" || fail "$name: convert: $(cat "$work/err")"
    "$bin" generate -m "$work/$name/pipeline" $args -o "$work/$name-converted.png" \
        2>"$work/err" || fail "$name: the converted folder: $(cat "$work/err")"
    cmp -s "$work/$name.png" "$work/$name-converted.png" ||
        fail "$name: the converted folder gives another image"
    "$bin" generate -m "$dir" $args -o "$work/$name-folder.png" 2>"$work/err" ||
        fail "$name: the folder: $(cat "$work/err")"
    cmp -s "$work/$name.png" "$work/$name-folder.png" &&
        fail "$name: the file's image is the folder's (the file's values are rounded)"
}
run openclip "$golden/t2i-sd3/pipeline" --text-encoder-2 \
    "$cases/te-single-clip-g-openclip/clip_g-openclip-f16.safetensors"
run consolidated "$golden/t2i-flux2/pipeline" --text-encoder \
    "$cases/te-single-mistral-consolidated/consolidated-tiny-bf16.safetensors"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
