#!/bin/sh
# The configs diffuse ships (docs/io.md, "Shipped configs"): `diffuse config` lists the sets
# and writes one as a folder skeleton; a file with a released FLUX.1-schnell transformer
# (sparse: the header is real, the data a hole) is recognised with its shipped config, and
# `generate -m FILE` names the tokenizer folders and the component files still needed in one
# line; given them, it goes on to the weights. The same for an SD3.5-large transformer file,
# with SD3's three tokenizer folders and three encoders, or two of each with
# --text-encoder-3 none. A file of another size (the tiny all-in-one case) still needs --config DIR.
# Usage: shipped_configs.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 golden=$2 cases=$3
work=$4/shipped-configs-$$
rm -rf "$work" && mkdir -p "$work/tmp" || exit 1
export TMPDIR=$work/tmp
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# 8-byte little-endian length, the JSON header (padded to 8 with spaces), then a hole as
# long as the tensors' bytes.
sparse() { # sparse FILE HEADER DATA_BYTES
    h=$2
    while [ $((${#h} % 8)) -ne 0 ]; do h="$h "; done
    n=${#h}
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((n & 255)) $(((n >> 8) & 255)) \
        $(((n >> 16) & 255)) $(((n >> 24) & 255)))\\000\\000\\000\\000" > "$1"
    printf '%s' "$h" >> "$1"
    truncate -s $((8 + n + $3)) "$1"
}
P=model.diffusion_model.
a=393216 b=$((a + 256)) c=$((b + 56623104)) d=$((c + 132120576))
sparse "$work/flux1-schnell.safetensors" "{\"${P}img_in.weight\":{\"dtype\":\"BF16\",\"shape\":[3072,64],\"data_offsets\":[0,$a]},\"${P}double_blocks.0.img_attn.norm.key_norm.scale\":{\"dtype\":\"BF16\",\"shape\":[128],\"data_offsets\":[$a,$b]},\"${P}double_blocks.18.img_attn.qkv.weight\":{\"dtype\":\"BF16\",\"shape\":[9216,3072],\"data_offsets\":[$b,$c]},\"${P}single_blocks.37.linear1.weight\":{\"dtype\":\"BF16\",\"shape\":[21504,3072],\"data_offsets\":[$c,$d]}}" $d

"$bin" config > "$work/list" 2>&1 || fail "config: $(cat "$work/list")"
grep -qx "FLUX.1-schnell" "$work/list" || fail "config does not list FLUX.1-schnell: $(cat "$work/list")"
"$bin" config FLUX.1-schnell -o "$work/skel" > "$work/out" 2>&1 || fail "config -o: $(cat "$work/out")"
for f in model_index.json transformer/config.json vae/config.json scheduler/scheduler_config.json \
    text_encoder/config.json text_encoder_2/config.json; do
    [ -s "$work/skel/$f" ] || fail "config -o wrote no $f"
done
grep -q '"FluxPipeline"' "$work/skel/model_index.json" || fail "the skeleton's model_index.json"
for set in SD3-medium SD3.5-large; do
    grep -qx "$set" "$work/list" || fail "config does not list $set: $(cat "$work/list")"
    "$bin" config "$set" -o "$work/$set" > "$work/out" 2>&1 || fail "config $set -o: $(cat "$work/out")"
    for f in model_index.json transformer/config.json vae/config.json \
        scheduler/scheduler_config.json text_encoder/config.json text_encoder_2/config.json \
        text_encoder_3/config.json; do
        [ -s "$work/$set/$f" ] || fail "config $set -o wrote no $f"
    done
    grep -q '"StableDiffusion3Pipeline"' "$work/$set/model_index.json" ||
        fail "the $set skeleton's model_index.json"
done
grep -q '"num_layers": 38' "$work/SD3.5-large/transformer/config.json" ||
    fail "the SD3.5-large transformer config"
"$bin" config --help > "$work/help" 2>&1 && grep -q "shipped: .*SD3.5-large" "$work/help" ||
    fail "config --help: $(cat "$work/help")"
"$bin" config FLUX.9 -o "$work/bad" 2>"$work/err"
[ $? -eq 1 ] && [ "$(wc -l < "$work/err")" -eq 1 ] && grep -q "FLUX.1-schnell" "$work/err" ||
    fail "config of an unknown set: $(cat "$work/err")"

"$bin" inspect -s "$work/flux1-schnell.safetensors" > "$work/inspect" 2>&1
grep -q "config: shipped FLUX.1-schnell" "$work/inspect" || fail "inspect: $(cat "$work/inspect")"

# SD3.5-large's own file (the transformer alone, no prefix): context_embedder [2432, 4096],
# joint block 37 (its MLP names SD3.5-large; its attention the depth), the context
# modulation's width
w=2432
a=$((w * 4096 * 2)) b=$((a + 3 * w * w * 2)) c=$((b + 3 * w * w * 2)) d=$((c + 4 * w * w * 2))
e=$((d + 6 * w * 2))
sparse "$work/sd3.5_large.safetensors" "{\"context_embedder.weight\":{\"dtype\":\"BF16\",\"shape\":[$w,4096],\"data_offsets\":[0,$a]},\"joint_blocks.37.x_block.attn.qkv.weight\":{\"dtype\":\"BF16\",\"shape\":[$((3 * w)),$w],\"data_offsets\":[$a,$b]},\"joint_blocks.37.context_block.attn.qkv.weight\":{\"dtype\":\"BF16\",\"shape\":[$((3 * w)),$w],\"data_offsets\":[$b,$c]},\"joint_blocks.37.x_block.mlp.fc1.weight\":{\"dtype\":\"BF16\",\"shape\":[$((4 * w)),$w],\"data_offsets\":[$c,$d]},\"joint_blocks.0.context_block.adaLN_modulation.1.bias\":{\"dtype\":\"BF16\",\"shape\":[$((6 * w))],\"data_offsets\":[$d,$e]}}" $e
"$bin" inspect -s "$work/sd3.5_large.safetensors" > "$work/inspect" 2>&1
grep -q "config: shipped SD3.5-large" "$work/inspect" || fail "inspect SD3.5-large: $(cat "$work/inspect")"

args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
expect() { # expect REGEX generate-args...: status 1, one line matching REGEX, no image
    re=$1
    shift
    "$bin" generate "$@" $args -o "$work/bad.png" 2>"$work/err"
    got=$?
    if [ "$got" -ne 1 ] || [ "$(wc -l < "$work/err")" -ne 1 ] || ! grep -q -- "$re" "$work/err"; then
        fail "generate $*: status $got, wanted one line matching '$re': $(cat "$work/err")"
    elif [ -e "$work/bad.png" ]; then
        fail "generate $*: left bad.png"
    else
        echo "ok   $(cat "$work/err")"
    fi
}
flux=$golden/t2i-flux-schnell/pipeline
mkdir -p "$work/toks" "$work/half" && cp -r "$flux/tokenizer" "$flux/tokenizer_2" "$work/toks/" &&
    cp -r "$flux/tokenizer" "$work/half/" || fail "copying the tokenizers"
sf=$work/flux1-schnell.safetensors
expect "ships its configs.*still needed: tokenizer/ .*tokenizer_2/ .*vae (--vae FILE)" -m "$sf"
expect "still needed: tokenizer_2/ (in --config DIR: not in" -m "$sf" --config "$work/half"
expect "still needed: text_encoder (--text-encoder FILE), text_encoder_2 (--text-encoder-2 FILE)$" \
    -m "$sf" --config "$work/toks" --vae "$sf"
expect "loading on the shipped FLUX.1-schnell configs" -m "$sf" --config "$work/toks" \
    --vae "$sf" --text-encoder "$sf" --text-encoder-2 "$sf"
sd3=$golden/t2i-sd3/pipeline
mkdir -p "$work/sd3toks" && cp -r "$sd3/tokenizer" "$sd3/tokenizer_2" "$sd3/tokenizer_3" \
    "$work/sd3toks/" || fail "copying the SD3 tokenizers"
l=$work/sd3.5_large.safetensors
expect "is SD3.5-large: .*still needed: tokenizer/ .*tokenizer_2/ .*tokenizer_3/ .*text_encoder_3 (--text-encoder-3 FILE, or none to run without T5), vae (--vae FILE)" \
    -m "$l"
expect "loading on the shipped SD3.5-large configs" -m "$l" --config "$work/sd3toks" \
    --vae "$l" --text-encoder "$l" --text-encoder-2 "$l" --text-encoder-3 "$l"
# Without T5 (--text-encoder-3 none) neither it nor tokenizer_3/ is asked for.
mkdir -p "$work/cliptoks" && cp -r "$sd3/tokenizer" "$sd3/tokenizer_2" "$work/cliptoks/" ||
    fail "copying the CLIP tokenizers"
expect "still needed: text_encoder (--text-encoder FILE), text_encoder_2 (--text-encoder-2 FILE), vae (--vae FILE)$" \
    -m "$l" --config "$work/cliptoks" --text-encoder-3 none
expect "loading on the shipped SD3.5-large configs" -m "$l" --config "$work/cliptoks" \
    --vae "$l" --text-encoder "$l" --text-encoder-2 "$l" --text-encoder-3 none
expect "none shipped for this size.*--config DIR" \
    -m "$cases/pipe-flux-all-in-one/flux1-tiny-aio-fp8.safetensors" --config "$work/toks"
[ -z "$(ls "$work/tmp")" ] || fail "temporary config folders left: $(ls "$work/tmp")"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
