#!/bin/sh
# `diffuse inspect` on broken input: exit 1 with exactly one line on stderr naming the file,
# exit 2 for usage errors, 0 for good input, and never death by a signal.
# Usage: inspect_errors.sh PATH/TO/diffuse WORK_DIR
set -u
bin=$1
work=$2/inspect-errors-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0

# expect STATUS WORD ARGS...: runs inspect, checks the status and (for 1) one stderr line
# containing WORD.
expect() {
    want=$1 word=$2
    shift 2
    "$bin" inspect "$@" >"$work/out" 2>"$work/err"
    got=$?
    lines=$(wc -l <"$work/err")
    if [ "$got" -ne "$want" ]; then
        echo "FAIL inspect $*: status $got, expected $want"; cat "$work/err"
        failures=$((failures + 1))
    elif [ "$want" -eq 1 ] && { [ "$lines" -ne 1 ] || ! grep -q -- "$word" "$work/err"; }; then
        echo "FAIL inspect $*: expected one stderr line with '$word', got:"; cat "$work/err"
        failures=$((failures + 1))
    else
        echo "ok   inspect $* -> $got"
    fi
}

# listed LINE...: each LINE is a line of the last run's stdout (what inspect found).
listed() {
    for line in "$@"; do
        if ! grep -qxF -- "$line" "$work/out"; then
            echo "FAIL the listing lacks '$line':"; cat "$work/out"
            failures=$((failures + 1))
        fi
    done
}

# st FILE HEADER [DATA]: writes a safetensors file (header shorter than 256 bytes).
st() {
    printf "\\$(printf '%03o' ${#2})\\000\\000\\000\\000\\000\\000\\000%s${3:-}" "$2" >"$1"
}

# A good file: one F32 tensor holding 1.0.
good='{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
st "$work/good.safetensors" "$good" '\000\000\200\077'
expect 0 "" "$work/good.safetensors"
printf 'abc' >"$work/short.safetensors"
expect 1 "short.safetensors: truncated" "$work/short.safetensors"
printf '\377\377\000\000\000\000\000\000{}' >"$work/len.safetensors"
expect 1 "past the end" "$work/len.safetensors"
st "$work/shape.safetensors" '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}' '\000\000\200\077'
expect 1 "needs 2 x 4" "$work/shape.safetensors"
st "$work/newline.safetensors" '{"a\\nb":{"dtype":"X","shape":[],"data_offsets":[0,0]}}'
expect 1 "unknown dtype" "$work/newline.safetensors"

# A pipeline of classes diffuse does not implement (so no model check applies to them).
mkdir -p "$work/pipe/vae" "$work/pipe/transformer"
printf '{"vae": ["diffusers", "Y"], "transformer": ["diffusers", "X"]}' \
    >"$work/pipe/model_index.json"
cp "$work/good.safetensors" "$work/pipe/vae/diffusion_pytorch_model.safetensors"
printf '{"_class_name": "Y"}' >"$work/pipe/vae/config.json"
printf '{"_class_name": "X"}' >"$work/pipe/transformer/config.json"
expect 1 "transformer: no weights" "$work/pipe"
cp "$work/good.safetensors" "$work/pipe/transformer/model.safetensors"
# Every file is valid, but no pipeline class: listed, then not loadable (exit 1).
expect 1 "pipeline not loadable by this build: .*pipeline class '(none)' is not supported (supported: FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, StableDiffusion3Pipeline, StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline, Flux2Pipeline, Flux2KleinPipeline or FluxKontextPipeline)" "$work/pipe"
listed "component transformer: X" "component vae: Y"
printf '{"a": 1,}' >"$work/pipe/transformer/extra.json"
expect 1 "extra.json:1:" "$work/pipe"
rm "$work/pipe/transformer/extra.json"
# JSON files whose root is not an object, named, alone or in a folder.
printf '[{"_class_name": "X"}]' >"$work/config.json"
expect 1 "config.json: the root must be a JSON object, found array" "$work/config.json"
printf '"FluxPipeline"' >"$work/model_index.json"
expect 1 "model_index.json: the root must be a JSON object, found string" "$work/model_index.json"
printf '{"_class_name": "X"}' >"$work/other.json"
expect 0 "" "$work/other.json"
printf '[1, 2]' >"$work/pipe/transformer/config.json"
expect 1 "pipe/transformer/config.json: the root must be a JSON object, found array" "$work/pipe"
expect 1 "transformer/config.json: the root must be a JSON object" "$work/pipe/transformer"
printf '{"_class_name": "X"}' >"$work/pipe/transformer/config.json"
cp "$work/pipe/model_index.json" "$work/index.pipe"
printf '[]' >"$work/pipe/model_index.json"
expect 1 "pipeline not loadable by this build: .*pipe/model_index.json: the root must be a JSON object, found array" "$work/pipe"
listed "component transformer: X" "component vae: Y"
# Component names and classes are Python identifiers.
printf '{"_class_name": "FluxPipeline", "vae": ["diffusers", "../../etc/passwd"]}' \
    >"$work/pipe/model_index.json"
expect 1 "pipeline not loadable by this build: .*component 'vae': class '../../etc/passwd' is not a Python identifier" "$work/pipe"
listed "component transformer: X"
printf '{"_class_name": "FluxPipeline", "te-2": ["transformers", "T5EncoderModel"]}' \
    >"$work/pipe/model_index.json"
expect 1 "pipeline not loadable by this build: .*component name 'te-2' is not a Python identifier" "$work/pipe"
cp "$work/index.pipe" "$work/pipe/model_index.json"
printf '{"vae": ["diffusers", "Y"], "../x": ["diffusers", "X"]}' \
    >"$work/pipe/model_index.json"
expect 1 "pipeline not loadable by this build: .*plain name" "$work/pipe"
printf '{"weight_map": {"w": "/etc/passwd"}}' >"$work/model.safetensors.index.json"
expect 1 "absolute" "$work/model.safetensors.index.json"
mkfifo "$work/fifo.safetensors" && expect 1 "not a regular file" "$work/fifo.safetensors"
expect 1 "no such file" "$work/missing"

expect 2 "" 
expect 2 "" --bogus "$work/good.safetensors"
expect 2 "" "$work/good.safetensors" "$work/good.safetensors"

# The header's own rules: it begins with '{'; shapes and offsets are integer literals.
st "$work/space.safetensors" ' {"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' \
    '\000\000\200\077'
expect 1 "begins with ' '" "$work/space.safetensors"
st "$work/float-shape.safetensors" '{"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}' \
    '\000\000\200\077'
expect 1 "shape.0. is 1 (not an integer literal)" "$work/float-shape.safetensors"
st "$work/float-offset.safetensors" '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}' \
    '\000\000\200\077'
expect 1 "data_offsets.1. is 4 (not an integer literal)" "$work/float-offset.safetensors"

# A pipeline is checked as a load checks it: component classes, tokenizer files, links.
if "$bin" make-tiny --arch sd3 "$work/sd3" >/dev/null 2>&1; then
    expect 0 "" --summary "$work/sd3"
    cp "$work/sd3/model_index.json" "$work/index.orig"
    sed 's/"AutoencoderKL"/"AutoencoderTiny"/' "$work/index.orig" >"$work/sd3/model_index.json"
    # A class this build does not implement: what it found is listed, the pipeline is not
    # loadable (exit 1 with that line).
    expect 1 "^error: pipeline not loadable by this build: .*component 'vae' is a AutoencoderTiny; StableDiffusion3Pipeline supports AutoencoderKL$" --summary "$work/sd3"
    listed "component vae: AutoencoderTiny" "  weights match the SD3Transformer2DModel config"
    sed 's/"StableDiffusion3Pipeline"/"StableDiffusion4Pipeline"/' "$work/index.orig" \
        >"$work/sd3/model_index.json"
    expect 1 "not loadable by this build: .*pipeline class 'StableDiffusion4Pipeline' is not supported (supported: FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, StableDiffusion3Pipeline, StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline, Flux2Pipeline, Flux2KleinPipeline or FluxKontextPipeline)" --summary "$work/sd3"
    listed "component transformer: SD3Transformer2DModel"
    sed 's/"T5Tokenizer"/"BertTokenizer"/' "$work/index.orig" >"$work/sd3/model_index.json"
    expect 1 "not loadable by this build: .*component 'tokenizer_3' is a BertTokenizer; StableDiffusion3Pipeline supports T5Tokenizer or T5TokenizerFast" --summary "$work/sd3"
    # No model_index.json: its component folders are listed and checked, then exit 1.
    rm "$work/sd3/model_index.json"
    expect 1 "not loadable by this build: .*sd3/model_index.json: no such file" --summary "$work/sd3"
    listed "component transformer: SD3Transformer2DModel" "  weights match the SD3Transformer2DModel config"
    mkdir "$work/empty"
    expect 1 "not loadable by this build: .*empty/model_index.json: no such file" "$work/empty"
    cp "$work/index.orig" "$work/sd3/model_index.json"
    # A config's _class_name: another class than the index's, one this build does not
    # load, or not a string.
    cp "$work/sd3/transformer/config.json" "$work/config.orig"
    sed 's/"SD3Transformer2DModel"/"SD3Transformer3DModel"/' "$work/config.orig" \
        >"$work/sd3/transformer/config.json"
    expect 1 "transformer/config.json: key '_class_name': class 'SD3Transformer3DModel' is not supported (this loader reads SD3Transformer2DModel)" --summary "$work/sd3"
    expect 1 "transformer/config.json: class 'SD3Transformer3DModel' is not one this build loads (it loads FluxTransformer2DModel, SD3Transformer2DModel, Flux2Transformer2DModel," --summary "$work/sd3/transformer"
    sed 's/"SD3Transformer2DModel"/["SD3Transformer2DModel"]/' "$work/config.orig" \
        >"$work/sd3/transformer/config.json"
    expect 1 "transformer/config.json: key '_class_name': expected a string, found array" --summary "$work/sd3"
    expect 1 "transformer/config.json: key '_class_name': expected a string, found array" --summary "$work/sd3/transformer"
    cp "$work/config.orig" "$work/sd3/transformer/config.json"
    # special_tokens_map.json that is not JSON (transformers parses it whenever it is there).
    printf '{"pad_token": "<|endoftext|>",' >"$work/sd3/tokenizer/special_tokens_map.json"
    expect 1 "tokenizer/special_tokens_map.json:1:" --summary "$work/sd3"
    printf '["<pad>"]' >"$work/sd3/tokenizer_3/special_tokens_map.json"
    expect 1 "tokenizer_3/special_tokens_map.json: the root must be a JSON object, found array" --summary "$work/sd3/tokenizer_3"
    rm "$work/sd3/tokenizer/special_tokens_map.json" "$work/sd3/tokenizer_3/special_tokens_map.json"
    cp "$work/index.orig" "$work/sd3/model_index.json"
    cp "$work/sd3/tokenizer/vocab.json" "$work/vocab.orig"
    sed 's/"<|endoftext|>":\([0-9]*\)/"<|endoftext|>":0/' "$work/vocab.orig" \
        >"$work/sd3/tokenizer/vocab.json"
    expect 1 "tokenizer/vocab.json: tokens" --summary "$work/sd3"
    cp "$work/vocab.orig" "$work/sd3/tokenizer/vocab.json"
    cp "$work/sd3/tokenizer/merges.txt" "$work/merges.orig"
    printf 'q zz</w>\n' >>"$work/sd3/tokenizer/merges.txt"
    expect 1 "merges.txt:12: token 'zz</w>' is not in vocab.json" --summary "$work/sd3"
    cp "$work/merges.orig" "$work/sd3/tokenizer/merges.txt"
    printf '{"pad_token": "<pad>"}' >"$work/sd3/tokenizer/special_tokens_map.json"
    expect 1 "pad_token '<pad>' is neither" --summary "$work/sd3"
    rm "$work/sd3/tokenizer/special_tokens_map.json"
    mv "$work/sd3/scheduler" "$work/scheduler-outside"
    ln -s "$work/scheduler-outside" "$work/sd3/scheduler"
    expect 1 "outside the pipeline folder" --summary "$work/sd3"
    rm "$work/sd3/scheduler"
    mv "$work/scheduler-outside" "$work/sd3/scheduler"
    expect 0 "" --summary "$work/sd3"
else
    echo "FAIL make-tiny --arch sd3"; failures=$((failures + 1))
fi

# FLUX.2: the transformer and VAE checkers compare weights with configs, alone and in a
# pipeline folder; a tokenizer.json folder refuses a special_tokens_map.json that is not JSON.
if "$bin" make-tiny --arch flux2 "$work/flux2" >/dev/null 2>&1; then
    expect 0 "" --summary "$work/flux2"
    listed "pipeline loads: every component matches its class and config"
    expect 0 "" --summary "$work/flux2/transformer"
    listed "  weights match the Flux2Transformer2DModel config"
    expect 0 "" --summary "$work/flux2/vae"
    listed "  weights match the AutoencoderKLFlux2 config"
    cp "$work/flux2/transformer/config.json" "$work/flux2-config.orig"
    sed 's/"num_layers": 1/"num_layers": 2/' "$work/flux2-config.orig" \
        >"$work/flux2/transformer/config.json"
    expect 1 "key 'num_layers' is 2 but the weights hold 1 such blocks" --summary "$work/flux2/transformer"
    cp "$work/flux2-config.orig" "$work/flux2/transformer/config.json"
    cp "$work/flux2/model_index.json" "$work/flux2-index.orig"
    sed 's/"AutoencoderKLFlux2"/"AutoencoderKL"/' "$work/flux2-index.orig" \
        >"$work/flux2/model_index.json"
    expect 1 "vae/config.json: the folder holds an AutoencoderKLFlux2, not the AutoencoderKL the pipeline names" --summary "$work/flux2"
    cp "$work/flux2-index.orig" "$work/flux2/model_index.json"
    printf 'pad_token: <pad>' >"$work/flux2/tokenizer/special_tokens_map.json"
    expect 1 "tokenizer/special_tokens_map.json:1:" --summary "$work/flux2"
else
    echo "FAIL make-tiny --arch flux2"; failures=$((failures + 1))
fi

rm -rf "$work"
[ "$failures" -eq 0 ] || { echo "$failures failures"; exit 1; }
echo "all inspect checks passed"
# Model checks: a FLUX transformer whose config asks for more blocks than the weights hold,
# and one whose weight file lacks a tensor (the golden folder's own files, edited copies).
golden=$(dirname "$0")/../golden
if [ -d "$golden/flux-transformer/model" ]; then
    mkdir -p "$work/deep" "$work/missing"
    cp "$golden/flux-transformer/model/diffusion_pytorch_model.safetensors" "$work/deep/"
    sed 's/"num_layers": 2/"num_layers": 3/' "$golden/flux-transformer/model/config.json" \
        >"$work/deep/config.json"
    expect 1 "num_layers" "$work/deep"
    cp "$golden/flux-transformer/model/config.json" "$work/missing/"
    sed 's/"num_single_layers": 2/"num_single_layers": 1/' \
        "$golden/flux-transformer/model/config.json" >"$work/missing/config.json"
    cp "$golden/flux-transformer/model/diffusion_pytorch_model.safetensors" "$work/missing/"
    expect 1 "single_transformer_blocks" "$work/missing"
fi

