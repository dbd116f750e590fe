#!/usr/bin/env bash
# script-replay.sh - instructions inside EVALSHA per acquire+release pair of any two scripts.
#
#   bench/script-replay.sh KIND ACQUIRE.lua RELEASE.lua
#   bench/script-replay.sh basic bench/replay/basic_commands_acquire.lua \
#       bench/replay/basic_commands_release.lua
#   bench/script-replay.sh basic bench/replay/return1.lua bench/replay/return1.lua  # floor
#
# KIND (basic or fair) chooses the keys and arguments, those the library sends for an
# uncontended acquire (weight 1, limit 1, lease 10 s, mode 1) and its release. The scripts
# are sent as they are: to measure the library's own, prepend lua/prelude.lua (the library
# sends only the helpers a script calls; the others add about 0.4k each). Each pair uses a
# new holder id, as the library does. Runs redis-server under valgrind's callgrind, replays
# 200 and then 1,200 pairs through redis-cli (one request at a time on a unix socket), and
# prints the difference divided by 1,000, so start-up cancels out. bench/script-cost.sh
# measures the library itself the same way; this one is for trying a change to a script, or
# a script stripped to its commands, without building anything. Needs valgrind and redis-cli.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '3,7p' "$0" >&2; exit 2; }
kind=$1 acq=$2 rel=$3
case $kind in
basic) keys='4 r:{b}:meta r:{b}:holders r:{b}:waiters r:{b}:signal'
       args='1 10000 1 3000 1895632239919101 1' ;;
fair)  keys='4 r:{f}:meta r:{f}:owners r:{f}:timeouts r:{f}:sig:'
       args='1 10000 1 3000 fair x 1895632239919101 1' ;;
*) echo "script-replay: KIND is basic or fair" >&2; exit 2 ;;
esac
command -v valgrind >/dev/null || { echo "script-replay: needs valgrind" >&2; exit 1; }

ir_of() { # pairs -> Ir inside EVALSHA
    local dir pid sa sr
    dir=$(mktemp -d)
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg" redis-server --port 0 \
        --unixsocket "$dir/s" --save '' --appendonly no >/dev/null 2>"$dir/log" &
    pid=$!
    for _ in $(seq 300); do [ -S "$dir/s" ] && break; sleep 0.1; done
    sa=$(redis-cli -s "$dir/s" SCRIPT LOAD "$(cat "$acq")")
    sr=$(redis-cli -s "$dir/s" SCRIPT LOAD "$(cat "$rel")")
    for i in $(seq "$1"); do
        id=$(printf '%040x' $((i * 7919 + 12345)))
        echo "EVALSHA $sa $keys $id $args"
        echo "EVALSHA $sr $keys $id 1"
    done > "$dir/cmds"
    redis-cli -s "$dir/s" < "$dir/cmds" > "$dir/out"
    if grep -q '^ERR\|^(error)' "$dir/out"; then
        grep -m1 '^ERR\|^(error)' "$dir/out" >&2
    fi
    kill -TERM "$pid"
    wait "$pid" || true
    callgrind_annotate --inclusive=yes "$dir/cg" 2>/dev/null |
        awk '/:evalShaCommand /{gsub(",", "", $1); print $1; exit}'
    rm -rf "$dir"
}
a=$(ir_of 200)
b=$(ir_of 1200)
echo $(( (b - a) / 1000 ))
