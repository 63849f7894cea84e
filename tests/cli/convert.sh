#!/bin/sh
# `diffuse convert FILE --config DIR -o OUT`: the all-in-one case's file written as a
# diffusers folder passes that case (diffusers' from_single_file reference) when loaded as
# a folder, in every mode; without --config it is one error line saying how to give it.
# Usage: convert.sh PATH/TO/diffuse PATH/TO/diffuse-check GOLDEN_DIR CASES_DIR WORK_DIR
set -u
bin=$1 check=$2 golden=$3 cases=$4
work=$5/convert-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
case=$cases/pipe-flux-all-in-one

"$bin" convert "$case/flux1-tiny-aio-fp8.safetensors" --config "$golden/t2i-flux-schnell/pipeline" \
    -o "$work/out/pipeline" --threads 2 >/dev/null 2>"$work/err" || fail "convert: $(cat "$work/err")"
for f in model_index.json transformer/config.json transformer/diffusion_pytorch_model.safetensors \
         vae/diffusion_pytorch_model.safetensors tokenizer_2/spiece.model; do
    [ -s "$work/out/pipeline/$f" ] || fail "convert wrote no $f"
done
# The case, pointed at the written folder instead of the file.
mkdir "$work/case" && cp "$case/case.safetensors" "$work/case/" &&
    sed -e 's|"dir": "[^"]*"|"dir": "../out/pipeline"|' -e '/"single_file"/d' \
        "$case/case.json" > "$work/case/case.json" || fail "rewriting the case"
for mode in eager compile; do
    "$check" --mode $mode --threads 2 "$work/case" > "$work/check" 2>&1 ||
        fail "the converted folder ($mode): $(tail -3 "$work/check")"
done

"$bin" convert "$case/flux1-tiny-aio-fp8.safetensors" -o "$work/bad" 2>"$work/err"
got=$?
if [ "$got" -ne 1 ] || ! grep -q -- "--config DIR" "$work/err"; then
    fail "convert without --config: status $got: $(cat "$work/err")"
fi

rm -rf "$work"
[ "$failures" -eq 0 ] && echo "all passed"
exit "$failures"
