#!/bin/sh
# `diffuse generate --transformer FILE`: the transformer's weights from one file, the
# folder's transformer/config.json as its config. A diffusers-named single file gives the
# same image, bit for bit, as the folder; a file whose shapes disagree with the config and
# a pipeline other than FLUX.1 / SD3 are refused with one line naming the tensor / the
# pipeline.
# Usage: transformer_file.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 golden=$2 cases=$3
work=$4/transformer-file-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
flux=$golden/t2i-flux-schnell/pipeline
args="-p a-fox -W 32 -H 32 --steps 2 --seed 5 --threads 2"
failures=0
. "$(dirname "$0")/expect_refusal.sh"

"$bin" generate -m "$flux" $args -o "$work/folder.png" 2>"$work/err" || fail "folder run: $(cat "$work/err")"
"$bin" generate -m "$flux" $args -o "$work/file.png" \
    --transformer "$flux/transformer/diffusion_pytorch_model.safetensors" 2>"$work/err" ||
    fail "single-file run: $(cat "$work/err")"
cmp -s "$work/folder.png" "$work/file.png" || fail "the single-file image differs from the folder's"

# A folder of configs, tokenizers and the other components, with transformer/ holding only
# config.json, plus the transformer as a single file, is a complete pipeline.
# (named "pipeline" as the original: the PNG's parameters carry the folder's name)
mkdir "$work/cfg" && cp -r "$flux" "$work/cfg/pipeline" &&
    rm "$work/cfg/pipeline/transformer/diffusion_pytorch_model.safetensors" &&
    cp "$flux/transformer/diffusion_pytorch_model.safetensors" "$work/flux1.safetensors" ||
    fail "copying the pipeline"
"$bin" generate -m "$work/cfg/pipeline" $args -o "$work/cfg.png" --transformer "$work/flux1.safetensors" \
    2>"$work/err" || fail "config-only folder: $(cat "$work/err")"
cmp -s "$work/folder.png" "$work/cfg.png" || fail "the config-only folder's image differs"

# The tiny GGUF's pooled projection is 24 wide; this pipeline's config says 32.
expect "vector_in.in_layer.weight" -m "$flux" --transformer "$cases/flux-gguf-q8_0/flux1-tiny-q8_0.gguf"
# SD3 reads its own original layout: a FLUX.1 file holds none of its blocks; the tiny SD3
# single file's pooled projection is 24 wide, this pipeline's 80; FLUX.2 reads its own
# layout, so the FLUX.1 file holds none of its blocks either.
expect "transformer_blocks.0" -m "$golden/t2i-sd3/pipeline" --transformer "$cases/flux-gguf-q8_0/flux1-tiny-q8_0.gguf"
expect "y_embedder.mlp.0.weight" -m "$golden/t2i-sd3/pipeline" --transformer "$cases/sd3-single-comfy/sd3-tiny-comfy-fp8.safetensors"
expect "transformer_blocks.0" -m "$golden/t2i-flux2/pipeline" --transformer "$cases/flux-gguf-q8_0/flux1-tiny-q8_0.gguf"
expect "no-such.gguf" -m "$flux" --transformer "$work/no-such.gguf"

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
