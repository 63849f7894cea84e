#!/bin/sh
# diffuse-check reads diffusers' list arguments: the t2i-sd3-seed0 case rewritten with its
# prompt, negative prompt and generator as one-element lists must still pass (a list of one
# generator is one generator, as in diffusers), and lists that do not pair up must fail
# with a message naming the argument, as must arguments diffuse does not implement.
# Usage: check_batch_args.sh PATH/TO/diffuse-check GOLDEN_DIR WORK_DIR
set -u
bin=$1
golden=$2
work=$3/check-batch-args-$$
rm -rf "$work" && mkdir -p "$work" || exit 1
ln -s "$golden/t2i-sd3" "$work/t2i-sd3" || exit 1
failures=0

# make_case NAME SED_SCRIPT: the seed0 case with case.json rewritten by sed -z.
make_case() {
    mkdir "$work/$1" && ln -s "$golden/t2i-sd3-seed0/case.safetensors" "$work/$1/" &&
        sed -z "$2" "$golden/t2i-sd3-seed0/case.json" >"$work/$1/case.json"
}

# expect STATUS WORD CASE: runs diffuse-check on the case.
expect() {
    "$bin" --threads 2 "$work/$3" >"$work/out" 2>&1
    got=$?
    if [ "$got" -ne "$1" ] || ! grep -q -- "$2" "$work/out"; then
        echo "FAIL $3: status $got (expected $1), output without '$2':"; cat "$work/out"
        failures=$((failures + 1))
    else
        echo "ok   $3 -> $got"
    fi
}

lists='s/"prompt": \("[^"]*"\)/"prompt": [\1]/; s/"negative_prompt": \("[^"]*"\)/"negative_prompt": [\1]/; s/"generator": \({[^}]*}\)/"generator": [\1]/'
make_case lists "$lists" || exit 1
grep -q '"generator": \[' "$work/lists/case.json" || { echo "FAIL: the rewrite did nothing"; exit 1; }
expect 0 "PASS" lists

make_case two-negatives 's/"negative_prompt": \("[^"]*"\)/"negative_prompt": [\1, ""]/' || exit 1
expect 1 "2 negative prompts for a batch of 1" two-negatives

make_case two-generators 's/"generator": \({[^}]*}\)/"generator": [\1, \1]/' || exit 1
expect 1 "a list of 2 generators was given for a batch of 1 images" two-generators

make_case gpu-generator 's/"device": "cpu"/"device": "cuda"/' || exit 1
expect 1 "only torch's CPU generator" gpu-generator

# what is not implemented fails rather than being ignored
make_case prompt-2 's/"negative_prompt": /"prompt_2": "a fox", "negative_prompt": /' || exit 1
expect 1 "args.prompt_2: separate prompts per text encoder are not implemented" prompt-2

rm -rf "$work"
[ "$failures" -eq 0 ]
