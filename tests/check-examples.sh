#!/bin/sh
# Compile (with -Wall -Wextra -Werror) and link every ```c block of the given Markdown files
# against the library just built, so that the examples in README.md and docs/ stay true.
#   check-examples.sh CC SRC_INCLUDE BUILD_INCLUDE LIBDIR FILE.md...
set -eu
cc=$1 inc=$2 binc=$3 libdir=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for md in "$@"; do
    awk -v dir="$tmp" -v base="$(basename "$md" .md)" '
        /^```c *$/ { n++; out = sprintf("%s/%s-%d.c", dir, base, n); inblock = 1; next }
        /^```/ && inblock { inblock = 0; close(out); next }
        inblock { print > out }' "$md"
done
for f in "$tmp"/*.c; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    if ! $cc -std=c11 -Wall -Wextra -Werror -I"$inc" -I"$binc" "$f" \
        -L"$libdir" -lredsem -o "$f.out" 2>"$f.err"; then
        echo "example $(basename "$f") does not compile:"; cat "$f.err"; cat -n "$f"; exit 1
    fi
done
[ "$n" -gt 0 ] || { echo "no C examples found"; exit 1; }
echo "ok: $n examples compile and link"
