#!/bin/sh
# `diffuse generate --image FILE --strength X` on a FLUX.1 and an SD3 text-to-image folder
# runs image to image: the PNG records the strength, the input file's name and its SHA-256
# (as sha256sum prints it), and the picture changes the result (the same seed without
# --image gives another image). Bad inputs are refused before any model loads (a missing
# model folder is never reached), naming the file and the rule.
# Usage: img2img_generate.sh PATH/TO/diffuse GOLDEN_DIR CASES_DIR WORK_DIR
set -u
diffuse=$1
golden=$2
cases=$3
work=$4/img2img-$$
failures=0
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

for arch in flux sd3; do
    if [ $arch = flux ]; then model=$golden/t2i-flux-schnell/pipeline; extra="";
    else model=$golden/t2i-sd3/pipeline; extra="--guidance 5"; fi
    image=$cases/img2img-$arch-s03/image.png
    # shellcheck disable=SC2086
    if "$diffuse" generate -m "$model" -p "a fox" -W 64 -H 64 --steps 4 --seed 3 --threads 2 \
            $extra --image "$image" --strength 0.5 -o "$work/$arch-i2i.png" >"$work/log" 2>&1 &&
       "$diffuse" generate -m "$model" -p "a fox" -W 64 -H 64 --steps 4 --seed 3 --threads 2 \
            $extra -o "$work/$arch-t2i.png" >>"$work/log" 2>&1; then
        echo "ok   $arch: generate with and without --image"
    else
        fail "$arch generate:"; cat "$work/log"; continue
    fi
    "$diffuse" info "$work/$arch-i2i.png" >"$work/info"
    hash=$(sha256sum "$image" | cut -d' ' -f1)
    grep -q "strength: *0.5\$" "$work/info" && grep -q "init image: *image.png\$" "$work/info" &&
        grep -q "init image hash: *$hash\$" "$work/info" &&
        echo "ok   $arch: the PNG records strength, input name and SHA-256" ||
        { fail "$arch: parameters:"; cat "$work/info"; }
    cmp -s "$work/$arch-i2i.png" "$work/$arch-t2i.png" &&
        fail "$arch: --image did not change the image" ||
        echo "ok   $arch: the input picture changes the result"
done

# FLUX.2 takes the picture as a reference to edit: the output takes its size (once
# Flux2ImageProcessor has cropped it to multiples of 16), the PNG records the input but no
# strength, and the picture changes the result; a strength, or a picture under 64 pixels, is
# refused.
f2=$golden/t2i-flux2/pipeline
ref=$cases/edit-flux2/image.png
if "$diffuse" generate -m "$f2" -p x --steps 1 --threads 2 --image "$ref" -o "$work/f2-ref.png" \
        >"$work/log" 2>&1 &&
   "$diffuse" generate -m "$f2" -p x -W 64 -H 64 --steps 1 --threads 2 -o "$work/f2-t2i.png" \
        >>"$work/log" 2>&1; then
    "$diffuse" info "$work/f2-ref.png" >"$work/info"
    head -n 1 "$work/info" | grep -q ": 64x64 RGB" && grep -q "init image: *image.png" "$work/info" &&
        ! grep -q "strength:" "$work/info" &&
        echo "ok   FLUX.2 --image: the reference's size, its name, no strength" ||
        { fail "FLUX.2 --image parameters:"; cat "$work/info"; }
    cmp -s "$work/f2-ref.png" "$work/f2-t2i.png" && fail "FLUX.2: --image changed nothing" ||
        echo "ok   FLUX.2: the reference changes the result"
else
    fail "FLUX.2 generate:"; cat "$work/log"
fi
two=$cases/edit-flux2-two
if "$diffuse" generate -m "$f2" -p x --steps 1 --threads 2 --image "$two/image0.png" \
        --image "$two/image1.png" -o "$work/f2-two.png" >"$work/log" 2>&1; then
    "$diffuse" info "$work/f2-two.png" | grep -q "init image: *image0.png, image1.png$" &&
        echo "ok   FLUX.2 with two --image: both recorded" ||
        { fail "FLUX.2 two references:"; "$diffuse" info "$work/f2-two.png"; }
else
    fail "FLUX.2 with two --image:"; cat "$work/log"
fi
if "$diffuse" generate -m "$f2" -p x --steps 1 --threads 2 \
        --image "$cases/edit-flux2-crop/image.png" -o "$work/f2-crop.png" >"$work/log" 2>&1; then
    "$diffuse" info "$work/f2-crop.png" | head -n 1 | grep -q ": 80x64 RGB" &&
        echo "ok   FLUX.2 with a 90x75 reference: cropped, the output 80x64" ||
        { fail "FLUX.2 cropped reference:"; "$diffuse" info "$work/f2-crop.png"; }
else
    fail "FLUX.2 with a 90x75 reference:"; cat "$work/log"
fi
for bad in "--strength 0.5|takes reference images, not a strength|$ref" \
           "--threads 2|too small: both sides must be at least 64|$cases/vae-encode-flux2-widths/image0.png"; do
    opt=${bad%%|*}; rest=${bad#*|}; text=${rest%%|*}; pic=${rest#*|}
    # shellcheck disable=SC2086
    if "$diffuse" generate -m "$f2" -p x --steps 1 $opt --image "$pic" -o "$work/f2-bad.png" \
            >"$work/err" 2>&1; then
        fail "FLUX.2 with $opt and $pic was accepted"
    elif grep -q "$text" "$work/err"; then
        echo "ok   FLUX.2 refuses: $(cat "$work/err")"
    else
        fail "FLUX.2 with $opt: $(cat "$work/err")"
    fi
done

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
refused "CMYK JPEG" "cmyk.jpg: CMYK JPEG is not supported" --image "$cases/image-input/cmyk.jpg"
refused "16-bit PNG" "sixteen-bit.png: 16-bit" --image "$cases/image-input/sixteen-bit.png"
printf 'not a picture' >"$work/notes.png"
refused "a text file" "notes.png: not a PNG or JPEG" --image "$work/notes.png"
head -c 200 "$cases/image-input/rgb.png" >"$work/cut.png"
refused "a truncated PNG" "cut.png: .*truncated or corrupt PNG" --image "$work/cut.png"
refused "strength 0" "strength must be in (0, 1]" --image "$cases/image-input/rgb.png" --strength 0
refused "strength 1.5" "strength must be in (0, 1]" --image "$cases/image-input/rgb.png" \
    --strength 1.5
refused "strength without an image" "strength needs --image" --strength 0.5

rm -rf "$work"
[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
