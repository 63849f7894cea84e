#!/bin/sh
# SD3 without T5 (tests/cases/t2i-sd3-no-t5, tools/refgen/sd3_no_t5.py). A folder whose
# model_index.json names text_encoder_3 / tokenizer_3 null, as diffusers saves one (the
# golden SD3 folder's other components with the case's model_index-no-t5.json), gives the
# case's diffusers result without any option, and the same image as `--text-encoder-3 none`
# on the full folder; -v and inspect say T5 is off. A folder that names T5 but lacks its
# folders fails saying how to run without it, and runs with the option, from -m FILE
# --config DIR too. Refused with one
# line: the option on FLUX.1, `none` with a T5 file. `convert --text-encoder-3 none` writes
# a folder without T5 that runs so (below).
# Usage: sd3_no_t5.sh PATH/TO/diffuse PATH/TO/diffuse-check GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 check=$2 golden=$3 cases=$4
work=$5/sd3-no-t5-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
sd3=$golden/t2i-sd3/pipeline
flux=$golden/t2i-flux-schnell/pipeline
case=$cases/t2i-sd3-no-t5
args="-p a-fox --negative-prompt blurry -W 32 -H 32 --steps 2 --seed 5 --threads 2 --guidance 2"
failures=0
. "$(dirname "$0")/expect_refusal.sh"

# pipeline_dir DIR INDEX: the golden SD3 folder's components but T5 and its tokenizer,
# each a folder of its own whose files link to the golden ones, and INDEX as
# model_index.json. Named pipeline/ as the golden folder is, so that the images' PNG
# parameters (which name the model folder) are the same.
pipeline_dir() {
    mkdir -p "$1" && cp "$2" "$1/model_index.json" || fail "making $1"
    for c in scheduler text_encoder text_encoder_2 tokenizer tokenizer_2 transformer vae; do
        mkdir -p "$1/$c"
        for f in "$sd3/$c"/*; do ln -s "$f" "$1/$c/" || fail "linking $f"; done
    done
}
null=$work/null/pipeline lost=$work/lost/pipeline
pipeline_dir "$null" "$case/model_index-no-t5.json"
pipeline_dir "$lost" "$sd3/model_index.json"

# The null folder against diffusers' result: the case, with its from_pretrained arguments
# renamed out of use, on the folder.
mkdir -p "$work/case" && ln -s "$case/case.safetensors" "$work/case/" &&
    sed -e 's|"dir": "[^"]*"|"dir": "../null/pipeline"|' -e 's|"from_pretrained"|"unused_from_pretrained"|' \
        "$case/case.json" > "$work/case/case.json" || fail "making the case on the null folder"
"$check" --mode eager --threads 2 "$work/case" > "$work/out" 2>&1 ||
    fail "the null folder against diffusers: $(cat "$work/out")"

"$bin" generate -m "$null" $args -v -o "$work/null.png" 2>"$work/err" ||
    fail "null folder: $(cat "$work/err")"
grep -q "^T5: off (text_encoder_3 is null in model_index.json)" "$work/err" ||
    fail "null folder -v: $(cat "$work/err")"
"$bin" generate -m "$sd3" $args -v --text-encoder-3 none -o "$work/none.png" 2>"$work/err" ||
    fail "--text-encoder-3 none: $(cat "$work/err")"
grep -q "^T5: off (--text-encoder-3 none)" "$work/err" || fail "none -v: $(cat "$work/err")"
cmp -s "$work/null.png" "$work/none.png" || fail "the null folder and --text-encoder-3 none differ"
"$bin" generate -m "$sd3" $args -v -o "$work/t5.png" 2>"$work/err" ||
    fail "with T5: $(cat "$work/err")"
grep -q "^T5: off" "$work/err" && fail "with T5, -v says T5 is off"
cmp -s "$work/t5.png" "$work/none.png" && fail "the image with T5 is the one without"
"$bin" generate -m "$lost" $args --text-encoder-3 none -o "$work/lost.png" 2>"$work/err" ||
    fail "a folder without text_encoder_3/, with none: $(cat "$work/err")"
cmp -s "$work/lost.png" "$work/none.png" || fail "the folder without text_encoder_3/ differs"
# -m FILE --config DIR: that folder with the option, the null folder without.
tf=$sd3/transformer/diffusion_pytorch_model.safetensors
"$bin" generate -m "$tf" --config "$lost" $args --text-encoder-3 none -o "$work/file.png" \
    2>"$work/err" || fail "-m FILE --config DIR, with none: $(cat "$work/err")"
"$bin" generate -m "$tf" --config "$null" $args -o "$work/file-null.png" 2>"$work/err" ||
    fail "-m FILE --config DIR, the null folder: $(cat "$work/err")"
cmp -s "$work/file.png" "$work/file-null.png" || fail "-m FILE --config DIR: the two differ"

"$bin" inspect -s "$null" > "$work/out" 2>&1 || fail "inspect: $(cat "$work/out")"
grep -q "^component text_encoder_3: not included (T5 off" "$work/out" ||
    fail "inspect: $(cat "$work/out")"
"$bin" generate --help | grep -q -- "--text-encoder-3 none" || fail "--help names none"

expect "text-encoder-3 none" -m "$lost"
expect "text-encoder-3 none" -m "$tf" --config "$lost"
expect "FluxPipeline has no text_encoder_3" -m "$flux" --text-encoder-3 none
expect "without T5 or with that file, not both" -m "$sd3" --text-encoder-3 none \
    --text-encoder-3 "$sd3/text_encoder_3/model.safetensors"
# convert --text-encoder-3 none: a folder without T5 whose model_index.json is the one
# diffusers' save_pretrained writes for text_encoder_3=None (the case's, but for the
# version), which runs without any option to the image of `none`, and passes the case.
# From the full folder, and from -m FILE --config DIR (the T5 folder's tokenizer not copied).
conv=$work/conv/pipeline
"$bin" convert "$sd3" -o "$conv" --text-encoder-3 none --threads 2 >/dev/null 2>"$work/err" ||
    fail "convert with none: $(cat "$work/err")"
for c in text_encoder_3 tokenizer_3; do
    [ -e "$conv/$c" ] && fail "convert with none wrote $c/"
done
grep -v '"_diffusers_version"' "$conv/model_index.json" > "$work/index-got"
grep -v '"_diffusers_version"' "$case/model_index-no-t5.json" > "$work/index-want"
cmp -s "$work/index-got" "$work/index-want" ||
    fail "convert with none: model_index.json: $(diff "$work/index-want" "$work/index-got")"
"$bin" generate -m "$conv" $args -v -o "$work/conv.png" 2>"$work/err" ||
    fail "the converted folder: $(cat "$work/err")"
grep -q "^T5: off (text_encoder_3 is null in model_index.json)" "$work/err" ||
    fail "the converted folder -v: $(cat "$work/err")"
cmp -s "$work/conv.png" "$work/none.png" || fail "the converted folder's image differs"
sed -i 's|"dir": "[^"]*"|"dir": "../conv/pipeline"|' "$work/case/case.json" &&
    "$check" --mode eager --threads 2 "$work/case" > "$work/out" 2>&1 ||
    fail "the converted folder against diffusers: $(cat "$work/out")"
conv2=$work/conv2/pipeline
"$bin" convert "$tf" --config "$lost" -o "$conv2" --text-encoder-3 none --threads 2 \
    >/dev/null 2>"$work/err" || fail "convert FILE --config DIR with none: $(cat "$work/err")"
[ -e "$conv2/tokenizer_3" ] || [ -e "$conv2/text_encoder_3" ] &&
    fail "convert FILE --config DIR with none wrote T5's folders"
"$bin" generate -m "$conv2" $args -o "$work/conv2.png" 2>"$work/err" ||
    fail "the folder converted from FILE: $(cat "$work/err")"
cmp -s "$work/conv2.png" "$work/none.png" || fail "the folder converted from FILE differs"
"$bin" convert "$flux" -o "$work/conv-flux" --text-encoder-3 none 2>"$work/err"
[ $? -eq 1 ] && grep -q "FluxPipeline has no text_encoder_3" "$work/err" ||
    fail "convert of FLUX.1 with none: $(cat "$work/err")"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
