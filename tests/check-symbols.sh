#!/bin/sh
# Every symbol libredsem.so exports starts with redsem_ (and no internal redsem__ leaks).
set -eu
lib=$1
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^redsem_[a-z0-9]' || true)
if [ -n "$bad" ]; then
    echo "symbols exported without the redsem_ prefix, or internal ones:"; echo "$bad"; exit 1
fi
count=$(nm -D --defined-only "$lib" | wc -l)
[ "$count" -gt 30 ] || { echo "only $count symbols exported: visibility broken?"; exit 1; }
echo "ok: $count redsem_ symbols"
