#!/bin/sh
# Every public function declared in include/redsem/ appears in docs/api.md, and every
# redsem_ function named in docs/api.md exists: the index cannot drift from the headers.
set -eu
src=$1
headers="$src/include/redsem"
doc="$src/docs/api.md"
declared=$(cat "$headers"/*.h "$headers"/version.h.in | grep -A1 '^REDSEM_API' |
    grep -o 'redsem_[a-z0-9_]*(' | tr -d '(' | sort -u)
documented=$(grep -o 'redsem_[a-z0-9_]*(' "$doc" | tr -d '(' | sort -u)
missing=$(printf '%s\n' "$declared" | while read -r f; do
    printf '%s\n' "$documented" | grep -qx "$f" || echo "$f"; done)
unknown=$(printf '%s\n' "$documented" | while read -r f; do
    printf '%s\n' "$declared" | grep -qx "$f" || echo "$f"; done)
status=0
[ -z "$missing" ] || { echo "public functions missing from docs/api.md:"; echo "$missing"; status=1; }
[ -z "$unknown" ] || { echo "docs/api.md names functions that do not exist:"; echo "$unknown"; status=1; }
[ "$status" -eq 0 ] && echo "ok: $(printf '%s\n' "$declared" | wc -l) public functions indexed"
exit $status
