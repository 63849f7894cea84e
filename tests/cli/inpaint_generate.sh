#!/bin/sh
# `diffuse generate --image FILE --mask FILE` on a FLUX.1 and an SD3 text-to-image folder
# inpaints: the PNG records the mask's name and SHA-256 beside the input's, the mask changes
# the result (against the image-to-image run of the same seed), and --padding-mask-crop
# gives an image of the picture's size with the padding recorded (the pixels themselves are
# checked against diffusers by the inpaint-* cases). Bad input is refused before any model loads (a missing model
# folder is never reached), or, for a FLUX.2 folder, before any model runs.
# Usage: inpaint_generate.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
diffuse=$1
golden=$2
cases=$3
work=$4/inpaint-$$
failures=0
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

for arch in flux sd3; do
    if [ $arch = flux ]; then model=$golden/t2i-flux-schnell/pipeline; extra="";
    else model=$golden/t2i-sd3/pipeline; extra="--guidance 5"; fi
    image=$cases/inpaint-$arch-s03/image.png
    mask=$cases/inpaint-$arch-s03/mask.png
    # shellcheck disable=SC2086
    if "$diffuse" generate -m "$model" -p "a fox" -W 64 -H 64 --steps 4 --seed 3 --threads 2 \
            $extra --image "$image" --mask "$mask" --strength 0.8 -o "$work/$arch-inp.png" \
            >"$work/log" 2>&1 &&
       "$diffuse" generate -m "$model" -p "a fox" -W 64 -H 64 --steps 4 --seed 3 --threads 2 \
            $extra --image "$image" --strength 0.8 -o "$work/$arch-i2i.png" >>"$work/log" 2>&1 &&
       "$diffuse" generate -m "$model" -p "a fox" -W 48 -H 48 --steps 4 --seed 3 --threads 2 \
            $extra --image "$image" --mask "$mask" --padding-mask-crop 4 \
            -o "$work/$arch-crop.png" >>"$work/log" 2>&1; then
        echo "ok   $arch: generate with --mask, without it, and with --padding-mask-crop"
    else
        fail "$arch generate:"; cat "$work/log"; continue
    fi
    "$diffuse" info "$work/$arch-inp.png" >"$work/info"
    hash=$(sha256sum "$mask" | cut -d' ' -f1)
    grep -q "init image: *image.png\$" "$work/info" && grep -q "mask image: *mask.png\$" "$work/info" &&
        grep -q "mask image hash: *$hash\$" "$work/info" && ! grep -q "mask padding" "$work/info" &&
        echo "ok   $arch: the PNG records the mask's name and SHA-256" ||
        { fail "$arch: parameters:"; cat "$work/info"; }
    "$diffuse" info "$work/$arch-crop.png" >"$work/info"
    head -n 1 "$work/info" | grep -q ": 64x64 RGB" && grep -q "mask padding: *4\$" "$work/info" &&
        echo "ok   $arch: --padding-mask-crop pastes back at the picture's size, recorded" ||
        { fail "$arch: crop parameters:"; cat "$work/info"; }
    cmp -s "$work/$arch-inp.png" "$work/$arch-i2i.png" &&
        fail "$arch: --mask did not change the image" ||
        echo "ok   $arch: the mask changes the result"
done

# A folder whose model_index.json says FluxInpaintPipeline (a copy of the golden one)
# inpaints with --mask, and refuses a run without one.
inp=$work/flux-inpaint
cp -r "$golden/t2i-flux-schnell/pipeline" "$inp"
sed 's/"FluxPipeline"/"FluxInpaintPipeline"/' "$golden/t2i-flux-schnell/pipeline/model_index.json" \
    >"$inp/index" && mv "$inp/index" "$inp/model_index.json"
if "$diffuse" generate -m "$inp" -p "a fox" -W 64 -H 64 --steps 4 --seed 3 --threads 2 \
        --image "$cases/inpaint-flux-s03/image.png" --mask "$cases/inpaint-flux-s03/mask.png" \
        -o "$work/class.png" >"$work/log" 2>&1 &&
   "$diffuse" info "$work/class.png" | grep -q "mask image: *mask.png"; then
    if "$diffuse" generate -m "$inp" -p "a fox" -W 64 -H 64 --steps 4 --threads 2 \
            -o "$work/none.png" >"$work/err" 2>&1; then
        fail "a FluxInpaintPipeline folder ran without a mask"
    elif grep -q "FluxInpaintPipeline needs an input image and a mask" "$work/err"; then
        echo "ok   a FluxInpaintPipeline folder inpaints, and refuses a run without a mask"
    else
        fail "FluxInpaintPipeline folder without a mask: $(cat "$work/err")"
    fi
else
    fail "FluxInpaintPipeline folder:"; cat "$work/log"
fi

refused() { # refused WHAT EXPECTED_TEXT ARGS...
    what=$1; text=$2; shift 2
    if "$diffuse" generate -m "$work/no-such-model" -p x -o "$work/x.png" "$@" \
            >"$work/err" 2>&1; then
        fail "$what was accepted"
    elif grep -q "$text" "$work/err" && ! grep -q "no-such-model" "$work/err"; then
        echo "ok   $what refused before the model: $(cat "$work/err")"
    else
        fail "$what: $(cat "$work/err")"
    fi
}
pic=$cases/inpaint-flux-s03/image.png
refused "a mask without an image" "mask needs one --image" --mask "$cases/inpaint-flux-s03/mask.png"
refused "a mask of another size" "mask.png is 80x72 but the --image is 64x64" --image "$pic" \
    --mask "$cases/inpaint-flux-s08-b2/mask.png"
refused "padding without a mask" "padding-mask-crop needs --mask" --image "$pic" \
    --padding-mask-crop 8
refused "padding 0" "padding-mask-crop" --image "$pic" --mask "$cases/inpaint-flux-s03/mask.png" \
    --padding-mask-crop 0
printf 'not a picture' >"$work/notes.png"
refused "a mask that is not a picture" "notes.png: not a PNG or JPEG" --image "$pic" \
    --mask "$work/notes.png"
refused "a mask with two images" "mask needs one --image FILE to paint into, not 2" --image "$pic" \
    --image "$pic" --mask "$cases/inpaint-flux-s03/mask.png"
# a FLUX.2 folder loads, then refuses the mask before any model runs
if "$diffuse" generate -m "$golden/t2i-flux2/pipeline" -p x --steps 1 --threads 2 \
        --image "$cases/edit-flux2/image.png" --mask "$cases/edit-flux2/image.png" \
        -o "$work/f2.png" >"$work/err" 2>&1; then
    fail "a FLUX.2 folder took --mask"
elif grep -q "mask (inpainting) is implemented for FLUX.1 and SD3 folders, not Flux2Pipeline" \
        "$work/err" && ! grep -q "step 1/1" "$work/err"; then
    echo "ok   FLUX.2 refuses --mask before a step: $(cat "$work/err")"
else
    fail "FLUX.2 with --mask: $(cat "$work/err")"
fi

rm -rf "$work"
[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
