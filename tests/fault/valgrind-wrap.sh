#!/bin/sh
# exe_wrapper of the 'valgrind' test setup (tests/fault/meson.build):
#   valgrind-wrap.sh SUPPRESSIONS PROGRAM [ARGS...]
# Criterion runs each test in a worker process of its own (fork and exec) and ignores the
# worker's exit status once the test has reported its result, so valgrind's --error-exitcode
# cannot fail a run. Every process therefore logs to a file of its own; afterwards any log
# with an error, or a definite or indirect leak, fails the test and is printed.
# Not checked: redis-server and system binaries (CMD of the CLI tests), and children made by
# a plain fork() in a test (--child-silent-after-fork): after fork() a child abandons the
# parent's handles on purpose (client.h, FORK), which valgrind would call a leak and, with
# --error-exitcode, would even change the child's exit status that the test checks.
set -u
supp=$1
shift
logdir=$(mktemp -d "${TMPDIR:-/tmp}/redsem-valgrind-XXXXXX") || exit 99
valgrind --quiet --log-file="$logdir/%p.log" --leak-check=full \
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
    --trace-children=yes --trace-children-skip='*redis-server*,/bin/*,/usr/bin/*' \
    --child-silent-after-fork=yes --suppressions="$supp" "$@"
status=$?
bad=0
for f in "$logdir"/*.log; do
    [ -s "$f" ] || continue
    if grep -qE "ERROR SUMMARY: [1-9]|definitely lost|indirectly lost|Invalid (read|write)|uninitialised" "$f"; then
        bad=$((bad + 1))
        echo "==== valgrind: $f" >&2
        cat "$f" >&2
    fi
done
rm -rf "$logdir"
if [ "$bad" -ne 0 ]; then
    echo "valgrind-wrap: $bad process(es) with errors or leaks (above)" >&2
    [ "$status" -eq 0 ] && status=99
fi
exit "$status"
