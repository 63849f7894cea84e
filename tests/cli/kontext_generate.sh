#!/bin/sh
# `diffuse generate` on a FLUX.1 Kontext folder (model_index.json says FluxKontextPipeline),
# assembled here from the tiny Kontext components of tests/cases/kontext-pipeline and the
# golden t2i-flux-schnell text encoders (copied: the library refuses component links that
# leave the folder). With --image it edits the
# picture: without -W / -H the output takes the folder's default size (64, this VAE's
# sample_size), with them exactly W x H; the PNG records the input's name and SHA-256 and no
# strength; the picture changes the result, and so does true CFG (--negative-prompt with
# --true-cfg-scale 2.5). A second picture, a strength and a picture under 16 pixels are
# refused, naming the rule, before any denoising step, and true CFG on the same components
# under FluxPipeline's model_index.json.
# Usage: kontext_generate.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
diffuse=$1
golden=$2
cases=$3
work=$4/kontext-$$
failures=0
rm -rf "$work" && mkdir -p "$work/model" || exit 1
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

model=$work/model
text=$(cd "$golden/t2i-flux-schnell/pipeline" && pwd) || exit 1
parts=$(cd "$cases/kontext-pipeline" && pwd) || exit 1
for c in text_encoder text_encoder_2 tokenizer tokenizer_2; do cp -r "$text/$c" "$model/$c"; done
for c in transformer vae scheduler; do cp -r "$parts/$c" "$model/$c"; done
cat >"$model/model_index.json" <<'EOF'
{
  "_class_name": "FluxKontextPipeline",
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "CLIPTextModel"],
  "text_encoder_2": ["transformers", "T5EncoderModel"],
  "tokenizer": ["transformers", "CLIPTokenizer"],
  "tokenizer_2": ["transformers", "T5Tokenizer"],
  "transformer": ["diffusers", "FluxTransformer2DModel"],
  "vae": ["diffusers", "AutoencoderKL"]
}
EOF
pic=$cases/kontext-latents/image.png
run() { "$diffuse" generate -m "$model" -p "make it red" --steps 2 --seed 4 --threads 2 \
            --max-sequence-length 32 "$@" >>"$work/log" 2>&1; }

if run --image "$pic" -o "$work/edit.png" && run -o "$work/plain.png" &&
   run --image "$pic" -W 96 -H 64 -o "$work/sized.png"; then
    echo "ok   Kontext: generate with --image, without, and with -W / -H"
    "$diffuse" info "$work/edit.png" >"$work/info"
    hash=$(sha256sum "$pic" | cut -d' ' -f1)
    head -n 1 "$work/info" | grep -q ": 64x64 RGB" &&
        grep -q "init image: *image.png\$" "$work/info" &&
        grep -q "init image hash: *$hash\$" "$work/info" && ! grep -q "strength:" "$work/info" &&
        echo "ok   Kontext: the default size, the input's name and SHA-256, no strength" ||
        { fail "Kontext parameters:"; cat "$work/info"; }
    "$diffuse" info "$work/sized.png" | head -n 1 | grep -q ": 96x64 RGB" &&
        echo "ok   Kontext: -W 96 -H 64 is the output size" ||
        { fail "Kontext -W 96 -H 64:"; "$diffuse" info "$work/sized.png"; }
    cmp -s "$work/edit.png" "$work/plain.png" && fail "Kontext: --image changed nothing" ||
        echo "ok   Kontext: the picture changes the result"
else
    fail "Kontext generate:"; cat "$work/log"
fi
if run --image "$pic" --negative-prompt "blurry" --true-cfg-scale 2.5 -o "$work/cfg.png"; then
    cmp -s "$work/edit.png" "$work/cfg.png" && fail "Kontext: --true-cfg-scale changed nothing" ||
        echo "ok   Kontext: true CFG with a negative prompt changes the result"
else
    fail "Kontext true CFG:"; cat "$work/log"
fi

refused() { # refused WHAT EXPECTED_TEXT ARGS...
    what=$1; expect=$2; shift 2
    if "$diffuse" generate -m "$model" -p x --steps 1 --threads 2 -o "$work/bad.png" "$@" \
            >"$work/err" 2>&1; then
        fail "$what was accepted"
    elif grep -q "$expect" "$work/err" && ! grep -q "step 1/" "$work/err"; then
        echo "ok   Kontext refuses $what: $(cat "$work/err")"
    else
        fail "$what: $(cat "$work/err")"
    fi
}
refused "two pictures" "FluxKontextPipeline edits one picture, not a list of 2" \
    --image "$pic" --image "$pic"
refused "a strength" "FluxKontextPipeline takes no strength" --image "$pic" --strength 0.5
refused "an 8x29 picture" "input image: 8x29 is too small: both sides must be at least 16" \
    --image "$cases/image-input/resize-lanczos-8x29.png"
mkdir -p "$work/flux" && cp -r "$model"/* "$work/flux/" &&
    sed -i 's/FluxKontextPipeline/FluxPipeline/' "$work/flux/model_index.json" || exit 1
if "$diffuse" generate -m "$work/flux" -p x --negative-prompt y --true-cfg-scale 2 --steps 1 \
        --threads 2 --max-sequence-length 32 -o "$work/bad.png" >"$work/err" 2>&1; then
    fail "true CFG on FluxPipeline was accepted"
elif grep -q "true CFG (true_cfg_scale 2 with a negative prompt) is implemented for \
FluxKontextPipeline, not FluxPipeline" "$work/err"; then
    echo "ok   FluxPipeline refuses true CFG: $(cat "$work/err")"
else
    fail "true CFG on FluxPipeline: $(cat "$work/err")"
fi
[ -f "$work/bad.png" ] && fail "a refused run wrote its output"

rm -rf "$work"
[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
