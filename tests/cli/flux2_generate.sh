#!/bin/sh
# `diffuse generate` on the tiny FLUX.2 folders (Flux2Pipeline, Flux2KleinPipeline): every
# mode, bf16, the offload levels (whose PNGs must be byte-identical to no offload), -n 2;
# `diffuse info` and `diffuse inspect` on them; and broken folders failing with one line
# naming what is wrong. 64 prompt tokens, not the pipelines' 512: the option matrix
# (tests/matrix.cmake) runs the default length in every mode.
# Usage: flux2_generate.sh PATH/TO/diffuse DEV_DIR KLEIN_DIR WORK_DIR
set -u
bin=$1
work=$4/flux2-generate-$$
klein=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0
fail() {
    echo "FAIL $*"
    failures=$((failures + 1))
}

for model in "$2" "$3"; do
    name=$(basename "$model")
    gen() { # gen OUT ARGS...
        out=$1
        shift
        if "$bin" generate -m "$model" -p "a fox in the snow" -W 48 -H 32 --steps 2 --seed 3 \
               --threads 2 --max-sequence-length 64 -o "$work/$out" "$@" >"$work/stdout" \
               2>"$work/err" &&
           [ -s "$work/$out" ]; then
            echo "ok   $name $*"
        else
            fail "$name generate $*:"; cat "$work/err"
        fi
    }
    gen "$name-eager.png"
    gen "$name-fuse.png" --mode fuse
    gen "$name-compile.png" --mode compile
    gen "$name-blocks.png" --mode fuse --compile-blocks
    gen "$name-bf16.png" --dtype bf16
    gen "$name-model.png" --offload model
    gen "$name-seq.png" --offload sequential
    gen "$name-n2.png" -n 2 --max-sequence-length 32
    for o in model seq; do
        cmp -s "$work/$name-eager.png" "$work/$name-$o.png" ||
            fail "$name: --offload $o differs from no offload"
    done
    [ -s "$work/$name-n2-1.png" ] || fail "$name: -n 2 wrote no second image"
    # info shows the PNG's generation parameters; inspect validates the folder
    "$bin" info "$work/$name-eager.png" >"$work/info" 2>&1 || fail "$name: info failed"
    for want in "a fox in the snow" "steps: *2" "48x32" "seed: *3" "model: *$name"; do
        grep -q "$want" "$work/info" || { fail "$name: info lacks '$want':"; cat "$work/info"; }
    done
    "$bin" inspect "$model" >"$work/inspect" 2>&1 ||
        { fail "$name: inspect failed:"; cat "$work/inspect"; }
done

# broken copies of the klein folder: one stderr line naming the problem, status 1
broken() { # broken WORD SETUP...
    word=$1
    shift
    rm -rf "$work/broken" && cp -r "$klein" "$work/broken" || exit 1
    (cd "$work/broken" && sh -c "$*") || exit 1
    "$bin" generate -m "$work/broken" -p "a fox" -W 32 -H 32 --steps 1 -o "$work/never.png" \
        >/dev/null 2>"$work/err"
    st=$?
    if [ "$st" -ne 1 ] || [ "$(grep -c . "$work/err")" -ne 1 ] || ! grep -q -- "$word" "$work/err"
    then
        fail "broken folder ($*): status $st, expected 1 and one line with '$word':"
        cat "$work/err"
    elif [ -e "$work/never.png" ]; then
        fail "broken folder ($*): wrote an image"
    else
        echo "ok   broken folder ($*): $(cat "$work/err")"
    fi
}
broken "tokenizer.json" "printf '{\"model\": ' > tokenizer/tokenizer.json"
broken "text_encoder" "rm text_encoder/model.safetensors"
broken "Qwen3ForCausalLM" "sed -i 's/Qwen3ForCausalLM/T5EncoderModel/' model_index.json"
broken "tokenizer" "rm -r tokenizer"
broken "context_embedder" \
    "sed -i 's/\"joint_attention_dim\": [0-9]*/\"joint_attention_dim\": 40/' transformer/config.json"

rm -rf "$work"
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
