#!/bin/sh
# `diffuse generate` on bad input: a one-line error on stderr, a non-zero exit, and no
# output file (nor a temporary one) left behind. Also: a good run writes the PNG, and the
# PNG's parameters read back through `diffuse info`.
# Usage: generate_errors.sh PATH/TO/diffuse TINY_FLUX_DIR WORK_DIR
set -u
bin=$1
model=$2
work=$3/generate-errors-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0

# expect STATUS WORD ARGS...: runs generate writing $work/out.png.
expect() {
    want=$1 word=$2
    shift 2
    "$bin" generate -o "$work/out.png" "$@" >"$work/stdout" 2>"$work/err"
    got=$?
    lines=$(grep -c . "$work/err")
    if [ "$got" -ne "$want" ]; then
        echo "FAIL generate $*: status $got, expected $want"; cat "$work/err"
        failures=$((failures + 1))
    elif [ "$want" -ne 0 ] && { [ "$lines" -ne 1 ] || ! grep -q -- "$word" "$work/err"; }; then
        echo "FAIL generate $*: expected one stderr line with '$word', got:"; cat "$work/err"
        failures=$((failures + 1))
    elif [ "$want" -ne 0 ] && ls "$work" | grep -q 'out\.png'; then
        echo "FAIL generate $*: left a file behind:"; ls "$work"
        failures=$((failures + 1))
    else
        echo "ok   generate $* -> $got"
    fi
    rm -f "$work"/out.png*
}

p="a fox"
expect 1 "multiples of 16" -m "$model" -p "$p" -W 64 -H 1000 --steps 1
expect 2 "--steps" -m "$model" -p "$p" -W 64 -H 64 --steps 0
expect 2 "need -m" -p "$p"
expect 2 "--dtype" -m "$model" -p "$p" --dtype f8
expect 1 "no-such-folder" -m "$work/no-such-folder" -p "$p" -W 64 -H 64
printf 'bad \377\376 bytes' >"$work/bad-prompt.txt"
expect 1 "UTF-8" -m "$model" --prompt-file "$work/bad-prompt.txt" -W 64 -H 64 --steps 1

# A folder missing a component, and one naming an unknown class.
cp -r "$model" "$work/no-vae" && rm -rf "$work/no-vae/vae"
expect 1 "vae" -m "$work/no-vae" -p "$p" -W 64 -H 64 --steps 1
cp -r "$model" "$work/odd-class"
sed 's/FluxTransformer2DModel/FancyTransformer/' "$model/model_index.json" \
    >"$work/odd-class/model_index.json"
expect 1 "FancyTransformer" -m "$work/odd-class" -p "$p" -W 64 -H 64 --steps 1

# An unwritable output: the folder does not exist, and a good existing file survives a
# failed run.
"$bin" generate -m "$model" -p "$p" -W 64 -H 64 --steps 1 -o "$work/missing-dir/x.png" \
    >/dev/null 2>"$work/err"
if [ $? -eq 0 ] || [ "$(grep -c . "$work/err")" -ne 1 ] || [ -e "$work/missing-dir" ]; then
    echo "FAIL unwritable output path"; cat "$work/err"; failures=$((failures + 1))
else
    echo "ok   unwritable output path"
fi

# A good run, and its parameters read back.
"$bin" generate -m "$model" -p "$p" -W 64 -H 64 --steps 2 --seed 5 -o "$work/good.png" \
    >/dev/null 2>&1 && "$bin" info "$work/good.png" >"$work/info" 2>&1
if ! grep -q "a fox" "$work/info" || ! grep -q "64x64" "$work/info"; then
    echo "FAIL good run / info"; cat "$work/info"; failures=$((failures + 1))
else
    echo "ok   good run and info"
fi
rm -rf "$work"
[ "$failures" -eq 0 ] || { echo "$failures failures"; exit 1; }
