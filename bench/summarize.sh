#!/bin/sh
# Median, minimum and maximum over several `redsem-bench --json` files of the figures the
# targets of issue 3 are about, of what TLS and WAIT cost (issue 9), of the expiry takeover
# (issue 14), of the rate limit and of weighted acquire (issue 12), of Redis in Action's
# semaphores beside fair and locked (issue 28), and of -w targets' lines (issue 25: each
# run's median of its repetitions) (needs jq). Each figure is
# a ratio or a count taken within one run; only those are comparable across runs on a noisy
# machine. The threads rows of runs with --shared (one client for all threads) are summarized
# apart from those without, with the connections the library used and the pool waits; a
# workload missing from a file is skipped.
#
#   bench/summarize.sh run1.json run2.json ...
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 FILE.json..." >&2
    exit 2
fi
command -v jq >/dev/null 2>&1 || { echo "$0: jq not found (apt-get install jq)" >&2; exit 1; }
jq -r -s '
def median: sort | if length == 0 then null
    elif length % 2 == 1 then .[length / 2 | floor]
    else (.[length / 2 - 1] + .[length / 2]) / 2 end;
def ms: if . == null then null else . / 1000 end;
def fmt: if . == null then "-" elif (. | fabs) >= 100 then (. * 10 | round / 10 | tostring)
    else (. * 10000 | round / 10000 | tostring) end;
def row($name; $vals): ($vals | map(select(. != null))) as $v |
    if ($v | length) == 0 then empty else
    "\($name)\t\($v | median | fmt)\t\($v | min | fmt) .. \($v | max | fmt)\t\($v | length)" end;
. as $runs |
"figure\tmedian\tmin .. max\truns",
( ["basic", "fair", "locked", "lock"][] as $s |
  ( [$runs[].uncontended // [] | .[] | select(.strategy == $s) | .ratio_pairs_per_s] ) as $v |
  row("uncontended \($s) pairs/s / floor"; $v) ),
( ( [$runs[].threads // [] | .[] | .threads] | unique | .[] ) as $t |
  ( [false, true][] as $sh | ($sh | if . then " shared client" else "" end) as $l |
    ( ["basic", "fair", "locked", "lock"][] as $s |
      ([$runs[].threads // [] | .[] |
        select(.strategy == $s and .threads == $t and (.shared_client // false) == $sh)]) as $r |
      row("threads=\($t)\($l) \($s) pairs/s / floor"; [$r[].ratio_pairs_per_s]),
      row("threads=\($t)\($l) \($s) library connections"; [$r[].lib_connections]),
      row("threads=\($t)\($l) \($s) pool waits"; [$r[].pool_waits]) ) ) ),
( ["basic", "fair", "locked"][] as $s |
  ( row("scale \($s) cost(100000)/cost(10)";
        [$runs[] | (.scale // []) as $sc |
         ($sc | map(select(.strategy == $s and .holders == 10)) | .[0]) as $lo |
         ($sc | map(select(.strategy == $s and .holders == 100000)) | .[0]) as $hi |
         if $lo and $hi then $hi.pair_us / $lo.pair_us else null end]),
    row("scale \($s) same, each / its floor";
        [$runs[] | (.scale // []) as $sc |
         ($sc | map(select(.strategy == $s and .holders == 10)) | .[0]) as $lo |
         ($sc | map(select(.strategy == $s and .holders == 100000)) | .[0]) as $hi |
         if $lo and $hi then ($hi.pair_us / $hi.floor_pair_us) / ($lo.pair_us / $lo.floor_pair_us)
         else null end]) ) ),
( [["book-fair", "fair"], ["book-locked", "locked"]][] as [$b, $s] |
  ( [$runs[].scale // [] | .[] | select(.strategy == $b) | .holders] | unique | .[] ) as $h |
  ([$runs[] | (.scale // []) as $sc |
    {b: ($sc | map(select(.strategy == $b and .holders == $h)) | .[0]),
     s: ($sc | map(select(.strategy == $s and .holders == $h)) | .[0])} |
    select(.b and .s)]) as $r |
  row("scale H=\($h) \($b) cost / \($s) cost"; [$r[] | .b.pair_us / .s.pair_us]),
  row("scale H=\($h) \($b) acquire p99 us"; [$r[].b.acquire.p99_us]),
  row("scale H=\($h) \($s) acquire p99 us"; [$r[].s.acquire.p99_us]),
  row("scale H=\($h) \($b) server us per acquire"; [$r[].b.server.server_us_per_acquire]),
  row("scale H=\($h) \($s) server us per acquire"; [$r[].s.server.server_us_per_acquire]),
  row("scale H=\($h) \($b) longest acquire command us"; [$r[].b.server.max_acquire_command_us]),
  row("scale H=\($h) \($s) longest acquire command us"; [$r[].s.server.max_acquire_command_us]) ),
( ( [$runs[].contended.runs // [] | .[] | .clients] | unique | .[] ) as $c |
  ( ["basic", "fair", "locked", "lock", "book-fair", "book-locked"][] as $s |
    ([$runs[].contended.runs // [] | .[] | select(.strategy == $s and .clients == $c)]) as $r |
    row("contended C=\($c) \($s) max holders"; [$r[].max_holders]),
    row("contended C=\($c) \($s) grants/s / ideal"; [$r[].ratio_to_ideal]),
    row("contended C=\($c) \($s) round trips per grant"; [$r[].round_trips_per_grant]),
    row("contended C=\($c) \($s) server commands per grant"; [$r[].server_commands_per_grant]),
    row("contended C=\($c) \($s) hand-off p50 ms"; [$r[].handoff.p50_us / 1000]),
    row("contended C=\($c) \($s) hand-off p99 ms"; [$r[].handoff.p99_us / 1000]),
    row("contended C=\($c) \($s) acquire p99 ms"; [$r[].acquire.p99_us / 1000]),
    row("contended C=\($c) \($s) max wait ms"; [$r[].max_wait_ms]),
    row("contended C=\($c) \($s) under-grant"; [$r[].under_grant]),
    row("contended C=\($c) \($s) out of order, strict"; [$r[].out_of_order_strict]),
    row("contended C=\($c) \($s) out of order, margin"; [$r[].out_of_order_margin]),
    row("contended C=\($c) \($s) Jain index"; [$r[].jain_index]),
    row("contended C=\($c) \($s) over the limit"; [$r[].holders_over_limit_events]),
    row("contended C=\($c) \($s) server us per grant"; [$r[].server_us_per_grant]),
    row("contended C=\($c) \($s) longest acquire command us";
        [$r[].server.max_acquire_command_us // empty]) ) ),
( ["basic", "fair", "locked", "lock"][] as $s |
  ([$runs[].tls.uncontended // [] | .[] | select(.strategy == $s)]) as $r |
  row("tls \($s) pairs/s TLS / TCP, one client"; [$r[].ratio_pairs_per_s]),
  row("tls \($s) acquire p50 TLS / TCP"; [$r[].ratio_latency.acquire_p50]),
  row("tls \($s) acquire p99 TLS / TCP"; [$r[].ratio_latency.acquire_p99]),
  row("tls \($s) release p50 TLS / TCP"; [$r[].ratio_latency.release_p50]),
  row("tls \($s) pair p50 TLS - TCP us"; [$r[].added_us_pair_p50]),
  row("tls \($s) client CPU per pair TLS / TCP";
      [$r[] | .tls.client_cpu_us_per_pair / .tcp.client_cpu_us_per_pair]),
  row("tls \($s) server CPU per pair TLS / TCP";
      [$r[] | .tls.server_cpu_us_per_pair / .tcp.server_cpu_us_per_pair]),
  row("tls \($s) pairs/s TLS / TCP, 8 threads";
      [$runs[].tls.threads // [] | .[] | select(.strategy == $s) | .ratio_pairs_per_s]) ),
row("tls connect p50 TLS / TCP"; [$runs[].tls.connect.ratio_p50]),
row("tls connect p50 TCP us"; [$runs[].tls.connect.tcp.p50_us]),
row("tls connect p50 TLS us"; [$runs[].tls.connect.tls.p50_us]),
( ["basic", "fair", "locked", "lock", "raw"][] as $s |
  ([$runs[].sync.rows // [] | .[] | select(.strategy == $s) | .settings[]]) as $all |
  row("sync \($s) no WAIT acquire p50 us"; [$all[] | select(.replicas == 0) | .acquire.p50_us]),
  row("sync \($s) no WAIT acquire p99 us"; [$all[] | select(.replicas == 0) | .acquire.p99_us]),
  ( [1, 2][] as $n | ([$all[] | select(.replicas == $n)]) as $r |
    row("sync \($s) WAIT \($n) pairs/s / no WAIT"; [$r[].ratio_pairs_per_s]),
    row("sync \($s) WAIT \($n) acquire p50 / no WAIT"; [$r[].ratio_latency.acquire_p50]),
    row("sync \($s) WAIT \($n) acquire p99 / no WAIT"; [$r[].ratio_latency.acquire_p99]),
    row("sync \($s) WAIT \($n) acquire p50 - no WAIT us"; [$r[].added_us_acquire_p50]),
    row("sync \($s) WAIT \($n) failed"; [$r[].failed]) ) ),
( ["basic", "fair", "locked", "lock"][] as $s |
  ([$runs[].takeover // [] | .[] | select(.strategy == $s)]) as $r |
  row("takeover \($s) p50 ms after the lease ends"; [$r[].late.p50_us / 1000]),
  row("takeover \($s) p99 ms after the lease ends"; [$r[].late.p99_us / 1000]),
  row("takeover \($s) max ms after the lease ends"; [$r[].late.max_us / 1000]),
  row("takeover \($s) early grants"; [$r[].early]) ),
row("rate grants in K windows / K N"; [$runs[].rate.achieved_ratio]),
row("rate window violations"; [$runs[].rate.window_violations]),
row("rate wake-up p50 ms after a slot lapses"; [$runs[].rate.wake.p50_us | ms]),
row("rate wake-up p99 ms after a slot lapses"; [$runs[].rate.wake.p99_us | ms]),
row("rate wake-up max ms after a slot lapses"; [$runs[].rate.wake.max_us | ms]),
( ["basic", "fair", "locked"][] as $s |
  ([$runs[].weighted // [] | .[] | select(.strategy == $s)]) as $r |
  row("weighted \($s) grants/s"; [$r[].grants_per_s]),
  row("weighted \($s) permits/s"; [$r[].permits_per_s]),
  row("weighted \($s) max permits in use"; [$r[].max_permits_in_use]),
  row("weighted \($s) out of order"; [$r[].out_of_order]),
  ( [1, 2, 4, 8][] as $w |
    row("weighted \($s) weight \($w) grants";
        [$r[].classes[] | select(.weight == $w) | .grants]),
    row("weighted \($s) weight \($w) max wait ms";
        [$r[].classes[] | select(.weight == $w) | .wait.max_us / 1000]),
    row("weighted \($s) weight \($w) p99 wait ms";
        [$r[].classes[] | select(.weight == $w) | .wait.p99_us / 1000]) ) ),
( ( [$runs[].targets.targets // [] | .[] | .what] | unique | .[] ) as $w |
  ([$runs[].targets.targets // [] | .[] | select(.what == $w)]) as $r |
  row("target: \($w) (\($r[0].goal))";
      [$r[].median]) ),
row("elapsed s"; [$runs[].params.elapsed_s])
' "$@" | column -t -s "$(printf '\t')"
