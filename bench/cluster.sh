#!/bin/sh
# Start or stop a throwaway Redis Cluster on loopback for `redsem-bench --url` (issue 11):
#   bench/cluster.sh start DIR N   N primaries (1..16, no replicas) under DIR; prints the
#                                  redis+cluster:// URL (the first node first)
#   bench/cluster.sh stop DIR      stops them (by the pids recorded in DIR) and removes DIR
# Ports: the first free block of N from 21000 up (bus ports 10000 above).
set -eu
cmd=$1 dir=$2
case $cmd in
start)
    n=$3
    mkdir -p "$dir"
    port=21000
    addrs="" url=""
    i=0
    while [ "$i" -lt "$n" ]; do
        while redis-cli -p "$port" ping >/dev/null 2>&1; do port=$((port + 1)); done
        mkdir -p "$dir/$port"
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "$dir/$port/nodes.conf" --dir "$dir/$port" --save "" \
            --appendonly no --daemonize yes --pidfile "$dir/$port/redis.pid" \
            --logfile "$dir/$port/redis.log" >/dev/null
        addrs="$addrs 127.0.0.1:$port"
        url="${url:+$url,}127.0.0.1:$port"
        port=$((port + 1)) i=$((i + 1))
    done
    for a in $addrs; do
        p=${a#*:}
        until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.05; done
    done
    if [ "$n" -eq 1 ]; then
        p=${url#*:}
        redis-cli -p "$p" cluster addslotsrange 0 16383 >/dev/null
    else
        # shellcheck disable=SC2086
        redis-cli --cluster create $addrs --cluster-yes >/dev/null
    fi
    for a in $addrs; do
        p=${a#*:}
        until redis-cli -p "$p" cluster info | grep -q cluster_state:ok; do sleep 0.05; done
    done
    echo "redis+cluster://$url"
    ;;
stop)
    for pf in "$dir"/*/redis.pid; do
        [ -f "$pf" ] && kill "$(cat "$pf")" 2>/dev/null || true
    done
    sleep 0.5
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start DIR N | stop DIR" >&2
    exit 1
    ;;
esac
