#!/bin/sh
# Every public header compiles on its own, first in a translation unit, as C11 with
# -Wall -Wextra -Wpedantic -Werror: a user includes just the one it needs. The event-loop
# adapters are checked where their loop's header is installed (else said, not failed), with
# _GNU_SOURCE, which libuv's own header needs under -std=c11.
#   check-headers.sh CC SRC_INCLUDE BUILD_INCLUDE
set -eu
cc=$1 inc=$2 binc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for h in "$inc"/redsem/*.h "$inc"/redsem/adapters/*.h; do
    rel=${h#"$inc"/}
    case $rel in
    redsem/adapters/libuv.h) dep=uv.h ;;
    redsem/adapters/libevent.h) dep=event2/event.h ;;
    redsem/adapters/libev.h) dep=ev.h ;;
    *) dep= ;;
    esac
    # the loops' own headers need POSIX declarations that strict -std=c11 hides
    defs=
    [ -z "$dep" ] || defs=-D_GNU_SOURCE
    if [ -n "$dep" ] && ! printf '#include <%s>\n' "$dep" | $cc -E -x c - >/dev/null 2>&1; then
        echo "skipped: $rel (no <$dep> here)"
        continue
    fi
    printf '#include <%s>\nint redsem_header_check_%d;\n' "$rel" "$n" > "$tmp/t.c"
    if ! $cc -std=c11 -Wall -Wextra -Wpedantic -Werror $defs -I"$inc" -I"$binc" -fsyntax-only \
        "$tmp/t.c" 2>"$tmp/err"; then
        echo "$rel does not compile on its own:"; cat "$tmp/err"; exit 1
    fi
    n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "no headers found"; exit 1; }
echo "ok: $n public headers compile on their own"
