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
expect 0 "" "$work/pipe"
printf '{"a": 1,}' >"$work/pipe/transformer/extra.json"
expect 1 "extra.json:1:" "$work/pipe"
rm "$work/pipe/transformer/extra.json"
printf '{"vae": ["diffusers", "Y"], "../x": ["diffusers", "X"]}' \
    >"$work/pipe/model_index.json"
expect 1 "plain name" "$work/pipe"
printf '{"weight_map": {"w": "/etc/passwd"}}' >"$work/model.safetensors.index.json"
expect 1 "absolute" "$work/model.safetensors.index.json"
mkfifo "$work/fifo.safetensors" && expect 1 "not a regular file" "$work/fifo.safetensors"
expect 1 "no such file" "$work/missing"

expect 2 "" 
expect 2 "" --bogus "$work/good.safetensors"
expect 2 "" "$work/good.safetensors" "$work/good.safetensors"

rm -rf "$work"
[ "$failures" -eq 0 ] || { echo "$failures failures"; exit 1; }
echo "all inspect checks passed"
# Model checks: a FLUX transformer whose config asks for more blocks than the weights hold,
# and one whose weight file lacks a tensor (the golden folder's own files, edited copies).
golden=$(dirname "$0")/../../../shared/golden
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

