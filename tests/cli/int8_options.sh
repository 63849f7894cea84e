#!/bin/sh
# `diffuse generate --int8-group N|k --int8-path NAME` on the demo pipeline: the group
# changes the image and DIFFUSE_INT8_GROUP gives the option's image; the portable kernel
# gives the default kernel's image bit for bit (the project's kernels reach the same
# integers); bad values are refused naming the option or the kernel.
# Usage: int8_options.sh PATH/TO/diffuse MODEL_DIR WORK_DIR
set -u
diffuse=$1
model=$2
work=$3/int8-options-$$
failures=0
rm -rf "$work" && mkdir -p "$work" || exit 1
# whole-k layers (the demo's small k) run the project's kernel, not the path measured
# fastest on this CPU (DIFFUSE_INT8_GEMM, docs/int8.md), which may be oneDNN's: its last
# bits differ from the portable kernel's
export DIFFUSE_INT8_GEMM=own

run() { # run NAME ARGS...: an int8 image into $work/NAME.png
    name=$1; shift
    if ! "$diffuse" generate -m "$model" -p "a red circle" -W 64 -H 64 --steps 2 --seed 3 \
            --threads 2 --dtype int8 -o "$work/$name.png" "$@" >"$work/$name.log" 2>&1; then
        echo "FAIL generate $*:"; cat "$work/$name.log"; failures=$((failures + 1))
    fi
}
same() { # same A B WHAT
    if cmp -s "$work/$1.png" "$work/$2.png"; then echo "ok   $3"
    else echo "FAIL $3: $1.png and $2.png differ"; failures=$((failures + 1)); fi
}
differ() { # differ A B WHAT
    if cmp -s "$work/$1.png" "$work/$2.png"; then
        echo "FAIL $3: $1.png and $2.png are the same"; failures=$((failures + 1))
    else echo "ok   $3"; fi
}
refused() { # refused RC TEXT ARGS...: generate exits RC naming TEXT
    rc=$1 text=$2; shift 2
    "$diffuse" generate -m "$model" -p x -W 64 -H 64 --steps 1 --dtype int8 -o "$work/bad.png" \
        "$@" >"$work/bad.log" 2>&1
    got=$?
    if [ "$got" -eq "$rc" ] && grep -q -- "$text" "$work/bad.log"; then echo "ok   $* refused"
    else echo "FAIL $*: exit $got, not $rc naming $text:"; cat "$work/bad.log"
         failures=$((failures + 1)); fi
}

run default
run g32 --int8-group 32
run whole --int8-group k
run portable --int8-path portable
DIFFUSE_INT8_GROUP=32 run env32 # last: sh may keep an assignment before a function call
unset DIFFUSE_INT8_GROUP
differ default g32 "--int8-group 32 changes the image"
differ g32 whole "--int8-group k changes it again"
same env32 g32 "DIFFUSE_INT8_GROUP=32 gives --int8-group 32's image"
same default portable "--int8-path portable: the default kernel's image"
refused 2 --int8-group --int8-group 16
refused 2 --int8-group --int8-group all
refused 1 "int8_group" --int8-group 34
refused 1 "'fast'" --int8-path fast
[ -f "$work/bad.png" ] && { echo "FAIL a refused run wrote an image"; failures=$((failures + 1)); }

rm -rf "$work"
[ "$failures" -eq 0 ]
