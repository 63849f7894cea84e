#!/bin/sh
# Seeds in case.json are read exactly over torch's whole range, [-2^63, 2^64 - 1]: torch seeds
# mt19937 with the low 32 bits, so every seed that is 0 modulo 2^32 must reproduce the seed-0
# golden case, and 2^63 - 1 must draw what 2^32 - 1 draws.
# Usage: seed_range.sh PATH/TO/diffuse-check GOLDEN_DIR WORK_DIR
set -u
check=$1
src=$2/rng-randn-f32-small
work=$3/seed-range-$$
failures=0
[ -f "$src/case.json" ] || { echo "no golden case $src"; exit 1; }

# with_seed SEED: a copy of the seed-0 case whose generator has that seed.
with_seed() {
    rm -rf "$work/$1" && mkdir -p "$work/$1" || exit 1
    cp "$src/case.safetensors" "$work/$1/"
    sed "s/\"seed\": 0/\"seed\": $1/" "$src/case.json" >"$work/$1/case.json"
    grep -q "\"seed\": $1\$" "$work/$1/case.json" || { echo "cannot set seed $1"; exit 1; }
}

for seed in 4294967296 9223372036854775808 18446744069414584320 -4294967296 \
            -9223372036854775808; do
    with_seed "$seed"
    if "$check" "$work/$seed" >"$work/out" 2>&1; then
        echo "ok   seed $seed reproduces seed 0"
    else
        echo "FAIL seed $seed:"; cat "$work/out"; failures=$((failures + 1))
    fi
done

# 2^63 - 1 and 2^32 - 1 share their low 32 bits: the same draws, so the same (failing)
# comparison with the seed-0 outputs.
for seed in 9223372036854775807 18446744073709551615 4294967295; do
    with_seed "$seed"
    "$check" "$work/$seed" 2>&1 | grep '^  sample' >"$work/$seed.out"
    if ! grep -q FAIL "$work/$seed.out"; then
        echo "FAIL seed $seed matched seed 0"; failures=$((failures + 1))
    fi
done
for seed in 9223372036854775807 18446744073709551615; do
    if cmp -s "$work/$seed.out" "$work/4294967295.out"; then
        echo "ok   seed $seed draws what 4294967295 draws"
    else
        echo "FAIL seed $seed differs from 4294967295:"; cat "$work/$seed.out"
        failures=$((failures + 1))
    fi
done

# Past the range: one clear message.
for seed in 18446744073709551616 -9223372036854775809 1.5; do
    with_seed "$seed"
    if "$check" "$work/$seed" >"$work/out" 2>&1; then
        echo "FAIL seed $seed was accepted"; failures=$((failures + 1))
    elif grep -q "key 'args.generator.seed'" "$work/out"; then
        echo "ok   seed $seed refused: $(grep seed "$work/out" | head -1)"
    else
        echo "FAIL seed $seed: unclear message:"; cat "$work/out"; failures=$((failures + 1))
    fi
done
rm -rf "$work"
[ "$failures" -eq 0 ]
