#!/bin/sh
# A plugin builds outside the tree against the installed headers, and an installed layout
# finds its plugins without DIFFUSE_BACKEND_DIR: `cmake --install` of this build into a
# temporary prefix, the test plugin's source compiled with -I PREFIX/include only (no
# source tree, no library) into its libdir (where the Vulkan plugin installs too), then
#  - the installed `diffuse` (bindir, static library) lists testdev:0 (libdir beside bindir),
#  - a program on the installed libdiffuse.so lists it (the shared library's own folder),
#  - with DIFFUSE_BACKEND_AUTOLOAD=0 neither does, and `diffuse devices` still works.
# Usage: installed_plugins.sh BUILD_DIR LIBDIR_NAME PLUGIN_SOURCE LIST_DEVICES WORK_DIR CC
set -u
build=$1
libdir=$2
plugin_src=$3
lister=$4
prefix=$5/installed-plugins-$$
cc=$6
rm -rf "$prefix" && mkdir -p "$prefix" || exit 1
cmake --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1 ||
    { echo "FAIL cmake --install:"; cat "$prefix.log"; exit 1; }
for h in device.h ops.def; do
    [ -f "$prefix/include/diffuse/$h" ] || { echo "FAIL include/diffuse/$h is not installed"; exit 1; }
done
mkdir -p "$prefix/plugin-src" && cp "$plugin_src" "$prefix/plugin-src/" || exit 1
(cd "$prefix/plugin-src" &&
    "$cc" -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
          -I "$prefix/include" testdev.c -o "$prefix/$libdir/libdiffuse-testdev.so") ||
    { echo "FAIL the plugin does not build against the installed headers alone"; exit 1; }
echo "ok   the plugin built against $prefix/include alone"
unset DIFFUSE_BACKEND_DIR DIFFUSE_BACKEND_AUTOLOAD
failures=0
check() { # what, expected (yes|no), output
    if echo "$3" | grep -q '^testdev:0'; then found=yes; else found=no; fi
    if [ "$found" = "$2" ]; then
        echo "ok   $1: testdev found: $found"
    else
        echo "FAIL $1: testdev found: $found, expected $2; output:"
        echo "$3"
        failures=$((failures + 1))
    fi
}
out=$(cd / && "$prefix/bin/diffuse" devices --all 2>&1 | sed 's/ .*//')
check "installed diffuse" yes "$out"
out=$(cd / && LD_LIBRARY_PATH="$prefix/$libdir" "$lister" 2>&1)
check "program on the installed libdiffuse.so" yes "$out"
LD_LIBRARY_PATH="$prefix/$libdir" ldd "$lister" | grep -q "$prefix/$libdir/libdiffuse.so" ||
    { echo "FAIL the lister did not link the installed library:"; ldd "$lister"; failures=$((failures + 1)); }
out=$(cd / && DIFFUSE_BACKEND_AUTOLOAD=0 "$prefix/bin/diffuse" devices --all 2>&1 | sed 's/ .*//')
check "installed diffuse, DIFFUSE_BACKEND_AUTOLOAD=0" no "$out"
echo "$out" | grep -q '^cpu:0' || { echo "FAIL no cpu:0 without autoload"; failures=$((failures + 1)); }
rm -rf "$prefix" "$prefix.log"
[ "$failures" -eq 0 ]
