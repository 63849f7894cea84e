#!/bin/sh
# FLUX.2's VAE and text encoder from single files (`diffuse generate --vae FILE
# --text-encoder FILE`, `-m FILE --config DIR`): files in diffusers' / transformers' names
# give the folder's image bit for bit (Flux2KleinPipeline and Flux2Pipeline, and klein with a
# reference image, whose encoder the VAE file gives too); BFL's FLUX.2
# ae.safetensors, ComfyUI's Mistral and Qwen3 files and an all-in-one FLUX.2-dev file load
# and run; `diffuse convert` writes the all-in-one file as a diffusers folder that passes the
# file's case (pipe-flux2-all-in-one) in eager and compile mode; a file of the wrong model,
# --text-encoder-2 and an all-in-one file without --config are refused with one line.
# Usage: flux2_component_files.sh PATH/TO/diffuse PATH/TO/diffuse-check GOLDEN_DIR CASES_DIR
#        WORK_DIR
set -u
bin=$1 check=$2 golden=$3 cases=$4
work=$5/flux2-component-files-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
dev=$golden/t2i-flux2/pipeline
klein=$golden/t2i-flux2-klein/pipeline
args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
failures=0
. "$(dirname "$0")/expect_refusal.sh"

for name in klein dev; do
    eval dir=\$$name
    "$bin" generate -m "$dir" $args -o "$work/$name.png" 2>"$work/err" ||
        fail "$name folder: $(cat "$work/err")"
    "$bin" generate -m "$dir" $args -o "$work/$name-files.png" \
        --vae "$dir/vae/diffusion_pytorch_model.safetensors" \
        --text-encoder "$dir/text_encoder/model.safetensors" 2>"$work/err" ||
        fail "$name files: $(cat "$work/err")"
    [ -s "$work/$name.png" ] && cmp -s "$work/$name.png" "$work/$name-files.png" ||
        fail "$name: the single files' image differs from the folder's"
done

# A reference image: its encoder comes from the --vae file too.
img=$cases/vae-encode-flux2/image0.png
"$bin" generate -m "$klein" $args --image "$img" -o "$work/edit.png" 2>"$work/err" ||
    fail "klein edit, folder: $(cat "$work/err")"
"$bin" generate -m "$klein" $args --image "$img" -o "$work/edit-file.png" \
    --vae "$klein/vae/diffusion_pytorch_model.safetensors" 2>"$work/err" ||
    fail "klein edit, --vae file: $(cat "$work/err")"
[ -s "$work/edit.png" ] && cmp -s "$work/edit.png" "$work/edit-file.png" ||
    fail "klein edit: the --vae file's image differs from the folder's"
"$bin" generate -m "$klein" $args --image "$img" -o "$work/edit-bfl.png" \
    --vae "$cases/vae-single-flux2/flux2-ae.safetensors" 2>"$work/err" ||
    fail "klein edit, BFL ae.safetensors: $(cat "$work/err")"
[ -s "$work/edit-bfl.png" ] || fail "klein edit, BFL ae.safetensors: no image"

# The original layouts (bf16 / fp8 copies: a close image, not an equal one).
"$bin" generate -m "$dev" $args -o "$work/bfl.png" \
    --vae "$cases/vae-single-flux2/flux2-ae.safetensors" \
    --text-encoder "$cases/te-single-mistral-comfy/mistral_3_small_flux2-tiny-comfy-bf16.safetensors" \
    2>"$work/err" || fail "BFL ae.safetensors + ComfyUI Mistral: $(cat "$work/err")"
[ -s "$work/bfl.png" ] || fail "BFL ae.safetensors + ComfyUI Mistral: no image"
aio=$cases/pipe-flux2-all-in-one/flux2-tiny-aio-fp8.safetensors
"$bin" generate -m "$aio" --config "$dev" $args -o "$work/aio.png" 2>"$work/err" ||
    fail "-m FILE --config DIR: $(cat "$work/err")"
[ -s "$work/aio.png" ] || fail "-m FILE --config DIR: no image"
# the file's own VAE and encoder, or the ones named beside it
"$bin" generate -m "$aio" --config "$dev" $args -o "$work/aio-vae.png" \
    --vae "$dev/vae/diffusion_pytorch_model.safetensors" 2>"$work/err" ||
    fail "-m FILE --config DIR --vae FILE: $(cat "$work/err")"
cmp -s "$work/aio.png" "$work/aio-vae.png" && fail "--vae beside an all-in-one file was not used"
# klein's all-in-one file has no text encoder: the folder's, or the same one as a file
kaio=$cases/pipe-flux2-klein-all-in-one/flux2-klein-tiny-aio-fp8.safetensors
"$bin" generate -m "$kaio" --config "$klein" $args -o "$work/kaio.png" 2>"$work/err" ||
    fail "klein -m FILE --config DIR: $(cat "$work/err")"
"$bin" generate -m "$kaio" --config "$klein" $args -o "$work/kaio-te.png" \
    --text-encoder "$klein/text_encoder/model.safetensors" 2>"$work/err" ||
    fail "klein -m FILE --config DIR --text-encoder FILE: $(cat "$work/err")"
[ -s "$work/kaio.png" ] && cmp -s "$work/kaio.png" "$work/kaio-te.png" ||
    fail "klein all-in-one: --text-encoder FILE's image differs from the folder encoder's"

# convert: the folder holds the file's weights under diffusers' / transformers' names.
"$bin" convert "$aio" --config "$dev" -o "$work/out/pipeline" --threads 2 >/dev/null 2>"$work/err" ||
    fail "convert: $(cat "$work/err")"
for f in transformer/diffusion_pytorch_model.safetensors vae/diffusion_pytorch_model.safetensors \
         text_encoder/model.safetensors tokenizer/tokenizer.json; do
    [ -s "$work/out/pipeline/$f" ] || fail "convert wrote no $f"
done
mkdir "$work/case" && cp "$cases/pipe-flux2-all-in-one/case.safetensors" "$work/case/" &&
    sed -e 's|"dir": "[^"]*"|"dir": "../out/pipeline"|' -e '/"single_file"/d' \
        "$cases/pipe-flux2-all-in-one/case.json" > "$work/case/case.json" || fail "rewriting the case"
for mode in eager compile; do
    "$check" --mode $mode --threads 2 "$work/case" > "$work/check" 2>&1 ||
        fail "the converted folder ($mode): $(tail -3 "$work/check")"
done

expect "post_quant_conv.weight" -m "$dev" --vae "$golden/t2i-flux-schnell/pipeline/vae/diffusion_pytorch_model.safetensors"
expect "embed_tokens.weight" -m "$dev" --text-encoder "$cases/te-single-qwen3-comfy/qwen_3-tiny-comfy-fp8.safetensors"
expect "no Qwen3 language model" -m "$klein" --text-encoder "$cases/vae-single-flux2/flux2-ae.safetensors"
expect "one text encoder" -m "$klein" --text-encoder-2 "$klein/text_encoder/model.safetensors"
expect "--config DIR" -m "$aio"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
