#!/bin/sh
# The Vulkan device declares no int8 products (DF_CAP_INT8): `--dtype int8` and a folder saved by
# `diffuse quantize` must each stop with DF_E_UNSUPPORTED's message, naming what needed them
# (the compute dtype, the quantized tensor), and a nonzero exit that is not a crash.
# usage: int8_refused.sh DIFFUSE DIFFUSE_CHECK GOLDEN_CASE TINY_MODEL_DIR TMP_DIR
diffuse=$1 check=$2 case=$3 model=$4 tmp=$5/vk-int8
fail() { echo "FAIL: $*"; exit 1; }
expect_refused() { # $1 what, $2 the message it must give; the command's output on stdin
    out=$(cat)
    echo "$out" | tail -3
    [ "$rc" -ne 0 ] || fail "$1 exited 0"
    [ "$rc" -lt 128 ] || fail "$1 died of signal $((rc - 128))"
    echo "$out" | grep -q "vulkan:0 has no int8 products" ||
        fail "$1: no message saying vulkan:0 has no int8 products"
    echo "$out" | grep -q "$2" || fail "$1: the message does not name $2"
    echo "$out" | grep -q "vulkan validation:" && fail "$1: a validation message"
    return 0
}
rm -rf "$tmp" && mkdir -p "$tmp" || exit 1

# --dtype int8 on a golden case: refused when the context is made, before anything is loaded
out=$("$check" --device vulkan:0 --dtype int8 "$case" 2>&1); rc=$?
echo "$out" | expect_refused "diffuse-check --dtype int8" "compute dtype int8: vulkan:0"
echo "$out" | grep -q "devices with them: --device cpu:0" ||
    fail "diffuse-check --dtype int8: the message does not name the devices with int8 products"
out=$("$diffuse" generate -m "$model" -p fox -W 32 -H 32 --steps 1 --device vulkan:0 \
      --dtype int8 -o "$tmp/int8.png" 2>&1); rc=$?
echo "$out" | expect_refused "generate --dtype int8" "compute dtype int8: vulkan:0"

# a quantized folder: refused at its first int8 tensor, which the message names
"$diffuse" quantize -m "$model" -o "$tmp/model" >/dev/null || fail "diffuse quantize failed"
out=$("$diffuse" generate -m "$tmp/model" -p fox -W 32 -H 32 --steps 1 --device vulkan:0 \
      -o "$tmp/saved.png" 2>&1); rc=$?
echo "$out" | expect_refused "generate on a quantized folder" "tensor '.*' is saved quantized"
[ -e "$tmp/saved.png" ] && fail "a picture was written"
echo "vulkan: int8 compute and a quantized folder are refused with a message"
