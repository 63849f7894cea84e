#!/bin/sh
# `diffuse generate --profile`: the run's three phases with their seconds, the kernels' time
# per op kind (the linears among them), and the same image as a run without it.
# Usage: profile.sh PATH/TO/diffuse TINY_MODEL_DIR WORK_DIR
set -u
bin=$1
model=$2
work=$3/profile-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
run() { # OUT [OPTIONS...]
    out=$1
    shift
    "$bin" generate -m "$model" -p "a red fox" -W 32 -H 32 --steps 2 --threads 2 \
        -o "$work/$out.png" "$@" >/dev/null 2>"$work/$out.err" ||
        { echo "FAIL generate $*:"; cat "$work/$out.err"; exit 1; }
}
run plain
run profiled --profile
failures=0
for phase in encode denoise decode; do
    grep -Eq "^  $phase +[0-9]+\.[0-9]+ s +[0-9.]+%$" "$work/profiled.err" ||
        { echo "FAIL: no $phase line"; failures=$((failures + 1)); }
done
grep -Eq "^  linear +[0-9]+\.[0-9]+ s +[0-9.]+% +[1-9][0-9]* calls$" "$work/profiled.err" ||
    { echo "FAIL: no linear row"; failures=$((failures + 1)); }
grep -q "^profile:" "$work/plain.err" && { echo "FAIL: a profile without --profile"; failures=$((failures + 1)); }
cmp -s "$work/plain.png" "$work/profiled.png" ||
    { echo "FAIL: --profile changed the image"; failures=$((failures + 1)); }
[ "$failures" -eq 0 ] || cat "$work/profiled.err"
rm -rf "$work"
[ "$failures" -eq 0 ] && echo "ok   --profile: phases, kernels, same image"
