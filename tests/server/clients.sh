#!/bin/sh
# Runs tests/server/clients.py in a venv made inside the build folder the first time
# (python3 -m venv; openai, webuiapi, selenium and numpy from PyPI). The server itself needs
# no Python. Exit 77 (skipped) without python3-venv or PyPI, unless CI=true: then it fails.
#
#   clients.sh DIFFUSE_BIN MODEL_DIR BUILD_DIR
set -u
bin=$1 model=$2 build=$3
venv=$build/server-venv
out=$build/test-tmp/serve-clients
here=$(dirname "$0")
missing() {
    echo "$1"
    if [ "${CI:-}" = true ]; then exit 1; fi
    exit 77
}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai, webuiapi, selenium, numpy" 2>/dev/null; then
    python3 -m venv "$venv" || missing "python3 -m venv failed (python3-venv: make deps)"
    "$venv/bin/pip" install -q openai webuiapi selenium numpy ||
        missing "pip could not install openai webuiapi selenium numpy from PyPI"
fi
rm -rf "$out"
mkdir -p "$out"
exec "$venv/bin/python" "$here/clients.py" "$bin" "$model" "$out"
