#!/bin/sh
# `diffuse generate`: the help names only devices that are built in and the rule --dtype
# auto follows; -v says which dtype the run uses and why; a device that is not built in is
# refused on one line that lists those that are.
# Usage: generate_dtype_help.sh PATH/TO/diffuse TINY_MODEL_DIR WORK_DIR
set -u
bin=$1
model=$2
work=$3/generate-dtype-help-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

"$bin" generate --help >"$work/help" || fail "--help exits non-zero"
grep -qi "cuda" "$work/help" && fail "the help lists cuda devices, which are not built in"
grep -q -- "--device NAME\[:N\]  *auto, cpu or a plugin's device" "$work/help" ||
    fail "the help does not list the device choices"
"$bin" devices >"$work/devices" || fail "diffuse devices exits non-zero"
grep -q "^cpu:0 .*(auto)" "$work/devices" || fail "diffuse devices does not list cpu:0 as auto"
grep -q "sim:" "$work/devices" && fail "diffuse devices lists the test device without --all"
grep -q "bf16 for bf16 checkpoints on" "$work/help" && grep -q "CPUs with AMX-BF16, else f32" \
    "$work/help" || fail "the help does not state the --dtype auto rule"
grep -q "AVX512-BF16" "$work/help" && fail "the help still promises bf16 for AVX512-BF16"

for dtype in auto f32 bf16; do
    "$bin" generate -m "$model" -p "a fox" -W 32 -H 32 --steps 1 --threads 2 --dtype $dtype \
        -v -o "$work/out.png" >/dev/null 2>"$work/err" || { fail "--dtype $dtype:"; cat "$work/err"; }
    line=$(grep "^compute dtype " "$work/err")
    case "$dtype:$line" in
    auto:"compute dtype f32: this CPU "* | auto:"compute dtype bf16: the checkpoint "*) ;;
    f32:"compute dtype f32: asked for" | bf16:"compute dtype bf16: asked for") ;;
    *) fail "--dtype $dtype -v: '$line'"; cat "$work/err" ;;
    esac
    [ "$failures" -eq 0 ] && echo "ok   --dtype $dtype -v: $line"
done

"$bin" generate -m "$model" -p "a fox" -W 32 -H 32 --steps 1 --device cuda \
    -o "$work/out.png" >/dev/null 2>"$work/err"
if [ $? -eq 0 ] || [ "$(grep -c . "$work/err")" -ne 1 ] || ! grep -q "available: cpu" "$work/err"; then
    fail "--device cuda: expected one line listing the available backends:"; cat "$work/err"
else
    echo "ok   --device cuda: $(cat "$work/err")"
fi
rm -rf "$work"
[ "$failures" -eq 0 ]
