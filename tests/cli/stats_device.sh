#!/bin/sh
# `diffuse generate --stats-json` carries the device's counters: kernels dispatched and
# submits on a device that keeps them, and, in compiled mode on a device that records
# graphs, graph launches with fewer kernels recorded than dispatched (the later steps
# replay what the first recorded).
# Usage: stats_device.sh PATH/TO/diffuse TINY_MODEL_DIR WORK_DIR DEVICE MODE WANT_GRAPHS
set -u
bin=$1
model=$2
work=$3/stats-device-$$
device=$4
mode=$5
want_graphs=$6
rm -rf "$work" && mkdir -p "$work" || exit 1
"$bin" generate -m "$model" -p "a red fox" -W 32 -H 32 --steps 3 --threads 2 \
    --device "$device" --mode "$mode" --stats-json "$work/stats.json" -o "$work/out.png" \
    >/dev/null 2>"$work/err" || { echo "FAIL $device $mode:"; cat "$work/err"; exit 1; }
key() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$work/stats.json"; }
dispatches=$(key device_dispatches)
recorded=$(key device_dispatches_recorded)
submits=$(key device_submits)
graphs=$(key device_graph_launches)
echo "$device $mode: dispatches $dispatches, recorded $recorded, submits $submits, graph launches $graphs"
ok=1
[ -n "$dispatches" ] && [ "$dispatches" -gt 0 ] && [ -n "$submits" ] && [ "$submits" -gt 0 ] || ok=0
if [ "$want_graphs" = 1 ]; then
    [ -n "$graphs" ] && [ "$graphs" -gt 0 ] && [ "$recorded" -lt "$dispatches" ] || ok=0
fi
[ "$ok" = 1 ] || { echo "FAIL"; cat "$work/stats.json"; exit 1; }
rm -rf "$work"
