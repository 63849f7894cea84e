#!/bin/sh
# `diffuse generate --vae FILE --text-encoder FILE --text-encoder-2 FILE [--text-encoder-3
# FILE]`: components' weights from single files, the folder's configs. Files in diffusers' /
# transformers' names give the same image, bit for bit, as the folder (FLUX.1 and SD3); the
# original LDM VAE and a ComfyUI-prefixed fp8 CLIP-L load and run; a file that is not the
# component (FLUX.1's VAE in a FLUX.2 folder too) and --text-encoder-3 on FLUX.1 are refused
# with one line (FLUX.2's own files: flux2_component_files.sh); an
# all-in-one file runs with --config DIR and is refused without, saying how to give it.
# Usage: component_files.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 golden=$2 cases=$3
work=$4/component-files-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
flux=$golden/t2i-flux-schnell/pipeline
sd3=$golden/t2i-sd3/pipeline
args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
failures=0
. "$(dirname "$0")/expect_refusal.sh"

"$bin" generate -m "$flux" $args -o "$work/flux.png" 2>"$work/err" || fail "flux folder: $(cat "$work/err")"
"$bin" generate -m "$flux" $args -o "$work/flux-files.png" \
    --vae "$flux/vae/diffusion_pytorch_model.safetensors" \
    --text-encoder "$flux/text_encoder/model.safetensors" \
    --text-encoder-2 "$flux/text_encoder_2/model.safetensors" 2>"$work/err" ||
    fail "flux files: $(cat "$work/err")"
cmp -s "$work/flux.png" "$work/flux-files.png" || fail "FLUX.1: the single files' image differs"

sargs="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2 --guidance 2"
"$bin" generate -m "$sd3" $sargs -o "$work/sd3.png" 2>"$work/err" || fail "sd3 folder: $(cat "$work/err")"
"$bin" generate -m "$sd3" $sargs -o "$work/sd3-files.png" \
    --vae "$sd3/vae/diffusion_pytorch_model.safetensors" \
    --text-encoder "$sd3/text_encoder/model.safetensors" \
    --text-encoder-2 "$sd3/text_encoder_2/model.safetensors" \
    --text-encoder-3 "$sd3/text_encoder_3/model.safetensors" 2>"$work/err" ||
    fail "sd3 files: $(cat "$work/err")"
cmp -s "$work/sd3.png" "$work/sd3-files.png" || fail "SD3: the single files' image differs"

# The original layouts (float16 / fp8 copies of the same weights: a close image, not equal).
"$bin" generate -m "$flux" $args -o "$work/ldm.png" --vae "$cases/vae-single-flux/ae.safetensors" \
    --text-encoder "$cases/te-single-clip-comfy/clip_l-comfy-fp8.safetensors" 2>"$work/err" ||
    fail "ae.safetensors + ComfyUI CLIP-L: $(cat "$work/err")"
[ -s "$work/ldm.png" ] || fail "ae.safetensors + ComfyUI CLIP-L: no image"
"$bin" generate -m "$sd3" $sargs -o "$work/sd3-ldm.png" \
    --vae "$cases/vae-single-sd3-comfy/sd3-vae-comfy.safetensors" 2>"$work/err" ||
    fail "SD3 first_stage_model. VAE: $(cat "$work/err")"

expect "decoder.conv_in.weight" -m "$flux" --vae "$cases/te-single-clip-comfy/clip_l-comfy-fp8.safetensors"
expect "token_embedding" -m "$flux" --text-encoder "$cases/vae-single-flux/ae.safetensors"
expect "post_quant_conv" -m "$golden/t2i-flux2/pipeline" --vae "$cases/vae-single-flux/ae.safetensors"
expect "text_encoder_3" -m "$flux" --text-encoder-3 "$sd3/text_encoder_3/model.safetensors"
expect "no-such.safetensors" -m "$flux" --vae "$work/no-such.safetensors"

# -m FILE: an all-in-one checkpoint needs --config DIR for its configs and tokenizers.
aio=$cases/pipe-flux-all-in-one/flux1-tiny-aio-fp8.safetensors
expect "--config DIR" -m "$aio"
expect "no component" -m "$cases/pipe-flux-all-in-one/case.safetensors" --config "$flux"
# A config folder without the T5 tokenizer: the error names it and says where it comes from.
mkdir "$work/cfg" && cp -r "$flux/." "$work/cfg/" && rm -r "$work/cfg/tokenizer_2" ||
    fail "copying the config folder"
expect "tokenizer_2.*--config" -m "$aio" --config "$work/cfg"
"$bin" generate -m "$aio" --config "$flux" $args -o "$work/aio.png" 2>"$work/err" ||
    fail "-m FILE --config DIR: $(cat "$work/err")"
[ -s "$work/aio.png" ] || fail "-m FILE --config DIR: no image"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
