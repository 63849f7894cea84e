#!/bin/sh
# Trains the demo pipeline from scratch, both stages, seeded (see README.md beside this file):
#
#   tools/train-demo/train.sh OUT [WORK]
#
# stage 1 (straight-line rectified flow, 8000 steps) writes WORK/stage1 (default OUT.stage1),
# stage 2 (4-step rollout distillation, 2000 steps, from stage 1) writes OUT. Run it from the
# repository root after `make build` (it calls build/bin/diffuse make-tiny).
# PYTHON names the interpreter (default /work/venv-demo/bin/python), THREADS the torch
# threads of each stage (default 1; see README.md), STEPS1 and STEPS2 the two stages' steps.
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 OUT [WORK]" >&2
  exit 2
fi
out=$1
work=${2:-$out.stage1}
python=${PYTHON:-/work/venv-demo/bin/python}
threads=${THREADS:-1}
steps1=${STEPS1:-8000}
steps2=${STEPS2:-2000}
here=$(dirname "$0")

mkdir -p "$work"
start=$(date +%s)
echo "stage 1: $steps1 steps -> $work/stage1"
"$python" "$here/train.py" --out "$work/stage1" --objective line --ema 0 --lr 2e-3 \
    --threads "$threads" --steps "$steps1" --save-every 250
mid=$(date +%s)
echo "stage 1: $((mid - start)) s"
echo "stage 2: $steps2 steps from $work/stage1 -> $out"
"$python" "$here/train.py" --out "$out" --init "$work/stage1" --lr 1e-3 \
    --threads "$threads" --steps "$steps2" --save-every 250
end=$(date +%s)
echo "stage 2: $((end - mid)) s; both: $((end - start)) s"

# training.json (stage 2's arguments) also records stage 1's and the whole command.
"$python" - "$out/training.json" "$work/stage1/training.json" "$threads" "$steps1" "$steps2" \
    $((end - start)) <<'EOF'
import json
import sys
path, stage1, threads, steps1, steps2, seconds = sys.argv[1:]
with open(path) as f:
    record = json.load(f)
with open(stage1) as f:
    record["stage1"] = json.load(f)
record["command"] = (f"THREADS={threads} STEPS1={steps1} STEPS2={steps2} "
                     "tools/train-demo/train.sh OUT")
record["seconds_both_stages"] = int(seconds)
with open(path, "w") as f:
    json.dump(record, f, indent=1)
EOF
