#!/bin/sh
# Mistral's tekken.json inside a safetensors file (ComfyUI's tekken_model; the case
# tests/cases/te-tekken-comfy, tools/refgen/tekken_tokenizer.py). `diffuse tokenize` on the
# file gives transformers' ids for Flux2Pipeline's formatted prompts (and the golden
# folder's); a FLUX.2 folder without tokenizer files takes the text encoder file's tokenizer,
# with a note, and gives the image of the folder's tokenizer bit for bit; hostile tensors
# (F32, 2-D, not JSON, the old layout, bad base64, a repeated token, a stand-in, more than
# 64 MiB) are one-line refusals naming the file and what is wrong.
# Usage: tekken_tokenizer.sh PATH/TO/diffuse PATH/TO/diffuse-check GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 golden=$3 cases=$4
work=$5/tekken-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
case=$cases/te-tekken-comfy
file=$case/mistral-tiny-tekken.safetensors
dev=$golden/t2i-flux2/pipeline
args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
failures=0
. "$(dirname "$0")/expect_refusal.sh"

n=0
for p in "$case"/prompt-*.txt; do
    n=$((n + 1))
    want=$(sed -n "${n}p" "$case/expected.txt")
    got=$("$bin" tokenize -m "$file" -t flux2 -n 160 - < "$p" 2>&1 | head -1)
    [ "$got" = "$want" ] || fail "tokenize $p: got $got, want $want"
    folder=$("$bin" tokenize -m "$dev" -t flux2 -n 160 - < "$p" 2>&1 | head -1)
    [ "$folder" = "$want" ] || fail "the golden folder on $p differs from transformers"
done
[ "$n" -eq 4 ] || fail "expected 4 prompts, found $n"

# The golden FLUX.2 folder without tokenizer files (an empty tokenizer/), named pipeline/ as
# the golden one is so that the PNG parameters match.
notok=$work/notok/pipeline
mkdir -p "$notok/tokenizer" && cp "$dev/model_index.json" "$notok/" || fail "making the folder"
for c in scheduler text_encoder transformer vae; do
    mkdir -p "$notok/$c"
    for f in "$dev/$c"/*; do ln -s "$f" "$notok/$c/" || fail "linking $f"; done
done
"$bin" generate -m "$dev" $args --text-encoder "$file" -o "$work/folder.png" 2>"$work/err" ||
    fail "with the folder's tokenizer: $(cat "$work/err")"
"$bin" generate -m "$notok" $args --text-encoder "$file" -v -o "$work/tekken.png" \
    2>"$work/err" || fail "with the file's tokenizer: $(cat "$work/err")"
grep -q "tokenizer: Mistral's tekken.json (tekken_model) from $file" "$work/err" ||
    fail "no note on the file's tokenizer: $(cat "$work/err")"
cmp -s "$work/folder.png" "$work/tekken.png" || fail "the file's tokenizer gives another image"

# Refusals: the folder has none, so the file's is read and refused.
expect "is F32 with 1 dimensions; a tokenizer's bytes are a 1-D U8 tensor" -m "$notok" \
    --text-encoder "$case/bad-f32.safetensors"
expect "is U8 with 2 dimensions" -m "$notok" --text-encoder "$case/bad-2d.safetensors"
expect "tekken_model' (tekken.json): not a JSON object" -m "$notok" \
    --text-encoder "$case/bad-notjson.safetensors"
expect "without \"special_tokens\"" -m "$notok" --text-encoder "$case/bad-old.safetensors"
expect "vocab\[7\].token_bytes is not base64" -m "$notok" \
    --text-encoder "$case/bad-b64.safetensors"
expect "vocab\[260\] repeats vocab\[258\]" -m "$notok" --text-encoder "$case/bad-dup.safetensors"
standin=$cases/te-single-mistral-comfy/mistral_3_small_flux2-tiny-comfy-bf16.safetensors
expect "no \"config\" object" -m "$notok" --text-encoder "$standin"
expect "no tokenizer files" -m "$notok"
# More than 64 MiB: a sparse file whose header is real and whose data is a hole.
header='{"tekken_model":{"dtype":"U8","shape":[67108865],"data_offsets":[0,67108865]}}'
len=$(printf '%s' "$header" | wc -c)
{ printf "\\$(printf '%03o' "$len")\\000\\000\\000\\000\\000\\000\\000" &&
    printf '%s' "$header"; } > "$work/huge.safetensors" &&
    truncate -s $((8 + len + 67108865)) "$work/huge.safetensors" || fail "making the huge file"
expect "holds 67108865 bytes; a tekken.json is read up to 67108864" -m "$notok" \
    --text-encoder "$work/huge.safetensors"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
