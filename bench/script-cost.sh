#!/usr/bin/env bash
# script-cost.sh - what an acquire+release pair costs the server, in instructions.
#
#   bench/script-cost.sh [BUILD_DIR] [KINDS]      e.g. bench/script-cost.sh build basic,fair
#
# Runs redis-server under valgrind's callgrind and counts the instructions it executes
# (Ir), in all and inside EVALSHA, while redsem-bench makes acquire+release pairs through the library (the uncontended
# workload, which interleaves its floor) and while it makes only the floor's pairs (the same
# requests running "return 1": bench/floor.c). Each is run with 1000 and 3000 pairs, and the
# difference divided by 2000, so start-up, the fixed warm-up and connection costs cancel out. Instruction counts do not
# depend on the machine's load, unlike the bench's times, so small changes to the scripts
# show even on a busy machine; they leave out cache misses, so a ratio of times is somewhat
# higher than the ratio of instructions. Needs valgrind; takes about a minute per kind.
set -euo pipefail
build=${1:-build}
kinds=${2:-basic,fair,locked,lock}
bench="$build/bench/redsem-bench"
[ -x "$bench" ] || { echo "script-cost: $bench not built" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "script-cost: needs valgrind" >&2; exit 1; }

ir_of() { # workload kind pairs -> Ir of the server's whole run
    local dir pid
    dir=$(mktemp -d)
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg" redis-server --port 0 \
        --unixsocket "$dir/s" --save '' --appendonly no >/dev/null 2>"$dir/log" &
    pid=$!
    for _ in $(seq 300); do [ -S "$dir/s" ] && break; sleep 0.1; done
    "$bench" -q --url "unix://$dir/s" -w "$1" -s "$2" --pairs "$3" --rounds 1 >/dev/null
    kill -TERM "$pid"
    wait "$pid" || true
    # whole server, and inside EVALSHA only (what INFO commandstats times as its usec)
    echo "$(grep -m1 'Collected' "$dir/log" | awk '{gsub(",", "", $4); print $4}')" \
        "$(callgrind_annotate --inclusive=yes "$dir/cg" 2>/dev/null |
            awk '/:evalShaCommand /{gsub(",", "", $1); print $1; exit}')"
    rm -rf "$dir"
}

echo "instructions per acquire+release pair: whole server | inside EVALSHA (scripts' commands included)"
printf '%-8s %10s %10s %8s | %10s %10s %8s\n' kind library floor 'x floor' library floor 'x floor'
for k in ${kinds//,/ }; do
    read -r a1 e1 < <(ir_of uncontended "$k" 1000)
    read -r a3 e3 < <(ir_of uncontended "$k" 3000)
    read -r f1 g1 < <(ir_of floor "$k" 1000)
    read -r f3 g3 < <(ir_of floor "$k" 3000)
    floor=$(( (f3 - f1) / 2000 )); lib=$(( (a3 - a1) / 2000 - floor ))
    efloor=$(( (g3 - g1) / 2000 )); elib=$(( (e3 - e1) / 2000 - efloor ))
    awk -v k="$k" -v l="$lib" -v f="$floor" -v el="$elib" -v ef="$efloor" \
        'BEGIN { printf "%-8s %10d %10d %8.2f | %10d %10d %8.2f\n", k, l, f, l / f, el, ef, el / ef }'
done
