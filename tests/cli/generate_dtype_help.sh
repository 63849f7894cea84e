#!/bin/sh
# `diffuse generate`: the help names only devices that are built in and the rule --dtype
# auto follows; `diffuse devices` shows the CPU's measured matmul rates; -v says which dtype
# the run uses and why (fake rates through DIFFUSE_MATMUL_RATES decide as the probe's would);
# a device that is not built in is refused on one line that lists those that are.
# Usage: generate_dtype_help.sh PATH/TO/diffuse TINY_MODEL_DIR WORK_DIR
set -u
bin=$1
model=$2
work=$3/generate-dtype-help-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
export DIFFUSE_CACHE_DIR="$work/cache" # the probe measures once, here, not in $HOME
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

"$bin" generate --help >"$work/help" || fail "--help exits non-zero"
grep -qi "cuda" "$work/help" && fail "the help lists cuda devices, which are not built in"
grep -q -- "--device NAME\[:N\]  *auto, cpu or a plugin's device" "$work/help" ||
    fail "the help does not list the device choices"
"$bin" devices >"$work/devices" || fail "diffuse devices exits non-zero"
grep -q "^cpu:0 .*(auto)" "$work/devices" || fail "diffuse devices does not list cpu:0 as auto"
grep -q "sim:" "$work/devices" && fail "diffuse devices lists the test device without --all"
"$bin" devices --all | grep -q "^sim:0 *sim " || fail "diffuse devices --all does not list sim"
grep -q "bf16 for bf16 checkpoints where the device's bf16" "$work/help" &&
    grep -q "products measure >= 1.25x f32's, else f32" "$work/help" ||
    fail "the help does not state the --dtype auto rule"
grep -q "AMX" "$work/help" && fail "the help still decides --dtype auto by CPU flags"
grep -q "^ *matmul f32 [0-9]* GFLOP/s, bf16 [0-9]* GFLOP/s (" "$work/devices" ||
    fail "diffuse devices does not show the CPU's measured matmul rates"

for dtype in auto f32 bf16; do
    "$bin" generate -m "$model" -p "a fox" -W 32 -H 32 --steps 1 --threads 2 --dtype $dtype \
        -v -o "$work/out.png" >/dev/null 2>"$work/err" || { fail "--dtype $dtype:"; cat "$work/err"; }
    line=$(grep "^compute dtype " "$work/err")
    case "$dtype:$line" in
    auto:"compute dtype f32: bf16 products "* | auto:"compute dtype f32: the device "* |\
        auto:"compute dtype bf16: the checkpoint "*) ;;
    f32:"compute dtype f32: asked for" | bf16:"compute dtype bf16: asked for") ;;
    *) fail "--dtype $dtype -v: '$line'"; cat "$work/err" ;;
    esac
    [ "$failures" -eq 0 ] && echo "ok   --dtype $dtype -v: $line"
done

# --dtype auto with the rates a device could answer (DIFFUSE_MATMUL_RATES stands in for the
# probe): bf16 only for a bf16 checkpoint where bf16 is clearly faster; -v says the rates.
"$bin" make-tiny --arch sd3 --dtype bf16 "$work/bf16" >/dev/null || fail "make-tiny --dtype bf16"
for case in "f32=470,bf16=961 $work/bf16 bf16 961 against 470 GFLOP/s" \
    "f32=470,bf16=961 $model f32 but the checkpoint's weights are f32" \
    "f32=231,bf16=145 $work/bf16 f32 145 against f32's 231 GFLOP/s"; do
    set -- $case
    rates=$1 dir=$2 want=$3
    shift 3
    DIFFUSE_MATMUL_RATES=$rates "$bin" generate -m "$dir" -p "a fox" -W 32 -H 32 --steps 1 \
        --threads 2 -v -o "$work/out.png" >/dev/null 2>"$work/err" || { fail "$rates:"; cat "$work/err"; }
    line=$(grep "^compute dtype " "$work/err")
    case "$line" in
    "compute dtype $want: "*"$*"*) echo "ok   $rates $(basename "$dir"): $line" ;;
    *) fail "$rates $dir: expected $want naming '$*', got '$line'" ;;
    esac
done
DIFFUSE_MATMUL_RATES=fast "$bin" generate -m "$model" -p "a fox" -W 32 -H 32 --steps 1 \
    -o "$work/out.png" >/dev/null 2>"$work/err"
if [ $? -eq 0 ] || ! grep -q "DIFFUSE_MATMUL_RATES='fast'" "$work/err"; then
    fail "a malformed DIFFUSE_MATMUL_RATES is not refused naming it:"; cat "$work/err"
fi

"$bin" generate -m "$model" -p "a fox" -W 32 -H 32 --steps 1 --device cuda \
    -o "$work/out.png" >/dev/null 2>"$work/err"
if [ $? -eq 0 ] || [ "$(grep -c . "$work/err")" -ne 1 ] || ! grep -q "available: cpu" "$work/err"; then
    fail "--device cuda: expected one line listing the available backends:"; cat "$work/err"
else
    echo "ok   --device cuda: $(cat "$work/err")"
fi
rm -rf "$work"
[ "$failures" -eq 0 ]
