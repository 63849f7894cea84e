# Sourced by the CLI scripts that check `diffuse generate`'s refusals. The caller sets bin
# (the program), args (the common arguments), work (a scratch folder) and failures (0).

fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect WORD ARGS...: exit 1 with one stderr line holding WORD, and no image.
expect() {
    word=$1
    shift
    "$bin" generate $args -o "$work/bad.png" "$@" 2>"$work/err"
    got=$?
    if [ "$got" -ne 1 ] || [ "$(grep -c . "$work/err")" -ne 1 ] || ! grep -q -- "$word" "$work/err"; then
        fail "generate $*: status $got, expected 1 and one line with '$word':"; cat "$work/err"
    elif [ -e "$work/bad.png" ]; then
        fail "generate $*: left bad.png"
    else
        echo "ok   $(cat "$work/err")"
    fi
}
