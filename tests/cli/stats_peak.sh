#!/bin/sh
# `diffuse generate --stats-json` carries the run's peak of resident weights under every
# offload level (the largest of the phases that --verbose lists), never 0.
# Usage: stats_peak.sh PATH/TO/diffuse TINY_MODEL_DIR WORK_DIR
set -u
bin=$1
model=$2
work=$3/stats-peak-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0
for level in none model sequential; do
    "$bin" generate -m "$model" -p "a red fox" -W 32 -H 32 --steps 1 --threads 2 \
        --offload $level --stats-json "$work/stats.json" -v -o "$work/out.png" \
        >/dev/null 2>"$work/err" || { echo "FAIL --offload $level:"; cat "$work/err"; exit 1; }
    peak=$(sed -n 's/.*"peak_resident_weight_bytes":\([0-9]*\).*/\1/p' "$work/stats.json")
    # the phases' peaks in MiB from --verbose, as bytes are not printed there: compare > 0
    phases=$(grep -c "weights resident: peak" "$work/err")
    if [ -z "$peak" ] || [ "$peak" -eq 0 ] || [ "$phases" -ne 3 ]; then
        echo "FAIL --offload $level: peak_resident_weight_bytes '$peak', $phases phases"
        cat "$work/stats.json" "$work/err"
        failures=$((failures + 1))
    else
        echo "ok   --offload $level: peak_resident_weight_bytes $peak"
    fi
done
rm -rf "$work"
[ "$failures" -eq 0 ]
