#!/bin/sh
# Turn the JSON of `redsem-bench --json FILE` into PNG charts (gnuplot + jq, both in Debian:
# apt-get install gnuplot-nox jq).
#
#   bench/plot.sh FILE.json [OUTDIR [PREFIX]]
#
# Writes, for the workloads present in FILE.json:
#   OUTDIR/PREFIXlatency.png    uncontended acquire and release latency percentiles per
#                               strategy, with the floors (log scale)
#   OUTDIR/PREFIXthreads.png    uncontended pairs/s with T threads, library and floor (a
#                               client per thread, or one shared: --shared)
#   OUTDIR/PREFIXasync.png      the event-loop API's pairs/s at each depth, and its floor
#   OUTDIR/PREFIXloops.png      the loops workload: grants/s, and acquire and hand-off
#                               latency, per strategy
#   OUTDIR/PREFIXcontended.png  grants/s and hand-off latency vs clients, per strategy
#   OUTDIR/PREFIXscale.png      us per acquire+release pair vs holders, per strategy
# OUTDIR defaults to docs/img, PREFIX to "".
set -eu
if [ $# -lt 1 ] || [ $# -gt 3 ]; then
    echo "usage: $0 FILE.json [OUTDIR [PREFIX]]" >&2
    exit 2
fi
json=$1
out=${2:-docs/img}
prefix=${3:-}
for tool in jq gnuplot; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "$0: $tool not found (apt-get install jq gnuplot-nox)" >&2
        exit 1
    }
done
[ -r "$json" ] || { echo "$0: cannot read $json" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo; then
    term="pngcairo size 1000,560 noenhanced font 'DejaVu Sans,10'"
else
    term="png size 1000,560 noenhanced"
fi

# One line describing the run, under each title.
subtitle=$(jq -r '.params as $p | .machine as $m |
    "redsem \($p.redsem_version) (\($p.redsem_commit)), Redis \($p.redis_version), \($p.transport), " +
    "\($m.cores_online) cores, affinity \($p.affinity.mode), \($p.started_at)"' "$json")

has() { jq -e "has(\"$1\")" "$json" >/dev/null; }

# One colour per strategy in every chart.
color() {
    case $1 in
    basic) echo "#1f77b4" ;;
    fair) echo "#2ca02c" ;;
    locked) echo "#d62728" ;;
    lock) echo "#9467bd" ;;
    book-fair) echo "#98df8a" ;;   # the book's references: a paler shade of fair and locked
    book-locked) echo "#ff9896" ;;
    *) echo "#7f7f7f" ;;
    esac
}

# A clustered bar chart of a "label value1 value2" file: bars OUT TITLE DAT NAME1 NAME2
bars() {
    gnuplot <<EOF
set terminal $term
set output "$1"
set title "$2\n$subtitle"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set yrange [0:*]
set grid ytics
set key top right
set xtics rotate by -30
plot "$3" using 2:xtic(1) title "$4", '' using 3 title "$5"
EOF
}

# ---------------------------------------------------------------- latency percentiles
if has uncontended; then
    # columns: label p50 p90 p99 p99.9 (acquire) then the same for release
    jq -r '.uncontended[] |
        select(.acquire != null) |
        "\(.strategy) \(.acquire.p50_us) \(.acquire.p90_us) \(.acquire.p99_us) \(.acquire.p999_us) \(.release.p50_us) \(.release.p90_us) \(.release.p99_us) \(.release.p999_us)",
        "floor-\(.strategy) \(.floor_acquire.p50_us) \(.floor_acquire.p90_us) \(.floor_acquire.p99_us) \(.floor_acquire.p999_us) \(.floor_release.p50_us) \(.floor_release.p90_us) \(.floor_release.p99_us) \(.floor_release.p999_us)"' \
        "$json" >"$tmp/lat.dat"
    if [ -s "$tmp/lat.dat" ]; then
        gnuplot <<EOF
set terminal $term
set output "$out/${prefix}latency.png"
set multiplot layout 1,2 title "Uncontended latency, one client (us, log scale)\n$subtitle"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set yrange [1:*]
set grid ytics
set key top left
set xtics rotate by -30
set title "acquire"
plot "$tmp/lat.dat" using 2:xtic(1) title "p50", '' using 3 title "p90", \
     '' using 4 title "p99", '' using 5 title "p99.9"
set title "release"
plot "$tmp/lat.dat" using 6:xtic(1) title "p50", '' using 7 title "p90", \
     '' using 8 title "p99", '' using 9 title "p99.9"
unset multiplot
EOF
    fi
fi

# ---------------------------------------------------------------- threads
if has threads; then
    jq -r '.threads[] | "\(.strategy)/\(.threads) \(.pairs_per_s) \(.floor_pairs_per_s)"' \
        "$json" >"$tmp/thr.dat"
    who=$(jq -r 'if (.threads | length) > 0 and .threads[0].shared_client
        then "all threads share one client" else "one client per thread" end' "$json")
    if [ -s "$tmp/thr.dat" ]; then
        bars "$out/${prefix}threads.png" \
            "Uncontended pairs/s with T threads (strategy/T; $who), library vs its floor (a connection per thread)" \
            "$tmp/thr.dat" "redsem" "floor (same round trips)"
    fi
fi

# ---------------------------------------------------------------- async
if has async && jq -e '.async.throughput | type == "array"' "$json" >/dev/null; then
    jq -r '.async.throughput[] | "\(.strategy)/D=\(.depth) \(.pairs_per_s) \(.floor_pairs_per_s)"' \
        "$json" >"$tmp/async.dat"
    if [ -s "$tmp/async.dat" ]; then
        bars "$out/${prefix}async.png" \
            "Event-loop API: pairs/s with D operations in flight on one loop (strategy/D), vs a floor with D threads" \
            "$tmp/async.dat" "redsem_async" "floor"
    fi
fi

# ---------------------------------------------------------------- loops
if has loops && jq -e '.loops | type == "array" and length > 0' "$json" >/dev/null; then
    # columns: strategy grants/s acquire p50 p99, hand-off p50 p99 (ms; NaN: no hand-off)
    jq -r '.loops[] | "\(.strategy) \(.grants_per_s) \(.acquire.p50_us / 1000) \(.acquire.p99_us / 1000) " +
        (if .handoff.n > 0 then "\(.handoff.p50_us / 1000) \(.handoff.p99_us / 1000)" else "NaN NaN" end)' \
        "$json" >"$tmp/loops.dat"
    # no acquire had to wait (no hold: the semaphores are never full): no hand-off columns
    if jq -e '[.loops[].handoff.n] | add > 0' "$json" >/dev/null; then
        handoffs=", '' using 5 title \"hand-off p50\", '' using 6 title \"hand-off p99\""
        lat="latency (ms, log scale)"
    else
        handoffs=""
        lat="acquire latency (ms, log scale; no hand-off: no acquire had to wait)"
    fi
    what=$(jq -r '.params as $p | "\($p.loops) loops on \($p.loop_sems) semaphores of limit \($p.limit), hold \($p.loop_hold_min_ms)-\($p.loop_hold_max_ms) ms"' "$json")
    gnuplot <<EOF
set terminal $(echo "$term" | sed 's/size 1000,560/size 1200,560/')
set output "$out/${prefix}loops.png"
set multiplot layout 1,2 title "One libuv loop drives $what\n$subtitle"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set grid ytics
set key top right
set title "grants/s"
set yrange [0:*]
plot "$tmp/loops.dat" using 2:xtic(1) title "grants/s"
set title "$lat"
set logscale y
set yrange [0.1:*]
plot "$tmp/loops.dat" using 3:xtic(1) title "acquire p50", '' using 4 title "acquire p99"$handoffs
unset multiplot
EOF
fi

# ---------------------------------------------------------------- contended
if has contended; then
    strategies=$(jq -r '[.contended.runs[].strategy] | unique | .[]' "$json")
    plots_g=""
    plots_h=""
    for s in $strategies; do
        jq -r --arg s "$s" '.contended.runs[] | select(.strategy == $s) |
            "\(.clients) \(.grants_per_s) \(.ideal_grants_per_s) " +
            (if .handoff.n > 0 then "\(.handoff.p50_us / 1000) \(.handoff.p99_us / 1000)" else "NaN NaN" end)' \
            "$json" | sort -n >"$tmp/c-$s.dat"
        c=$(color "$s")
        plots_g="$plots_g \"$tmp/c-$s.dat\" using 1:2 with linespoints lw 2 lc rgb \"$c\" title \"$s\","
        plots_h="$plots_h \"$tmp/c-$s.dat\" using 1:4 with linespoints lw 2 lc rgb \"$c\" title \"$s p50\", \"$tmp/c-$s.dat\" using 1:5 with linespoints lw 1.5 dashtype (12,8) lc rgb \"$c\" title \"$s p99\","
    done
    limit=$(jq -r '.params.limit' "$json")
    hold=$(jq -r '.params | "\(.hold_min_ms)-\(.hold_max_ms) ms"' "$json")
    if [ -n "$plots_g" ]; then
        gnuplot <<EOF
set terminal $(echo "$term" | sed 's/size 1000,560/size 1200,560/')
set output "$out/${prefix}contended.png"
set multiplot layout 1,2 title "Contended: C clients on one semaphore of limit $limit (lock: 1), hold $hold\n$subtitle"
set logscale x 2
set grid
set xlabel "clients"
set key bottom right
set title "grants/s"
set yrange [0:*]
plot ${plots_g%,}
set title "hand-off latency, release to the next waiter's grant (ms)"
set key outside right top
set logscale y
set yrange [*:*]
plot ${plots_h%,}
unset multiplot
EOF
    fi
fi

# ---------------------------------------------------------------- scale
if has scale; then
    strategies=$(jq -r '[.scale[].strategy] | unique | .[]' "$json")
    plots=""
    for s in $strategies; do
        jq -r --arg s "$s" '.scale[] | select(.strategy == $s) |
            "\(.holders) \(.pair_us) \(.floor_pair_us)"' "$json" | sort -n >"$tmp/s-$s.dat"
        c=$(color "$s")
        plots="$plots \"$tmp/s-$s.dat\" using 1:2 with linespoints lw 2 lc rgb \"$c\" title \"$s\", \"$tmp/s-$s.dat\" using 1:3 with lines lw 1.5 dashtype (12,8) lc rgb \"$c\" title \"floor of $s\","
    done
    if [ -n "$plots" ]; then
        gnuplot <<EOF
set terminal $term
set output "$out/${prefix}scale.png"
set title "Cost of one more acquire+release with H holders already in (us per pair)\n$subtitle"
set logscale x 10
set grid
set xlabel "holders H"
set ylabel "us per pair"
$(if jq -e '[.scale[].strategy] | index("book-fair") or index("book-locked")' "$json" >/dev/null; then
    echo 'set logscale y  # the book references grow 1000-fold'; else echo 'set yrange [0:*]'; fi)
set key top left
plot ${plots%,}
EOF
    fi
fi

ls -1 "$out/${prefix}"*.png 2>/dev/null || true
