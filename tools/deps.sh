#!/bin/sh
# Install what redsem needs on Debian 12 (bookworm) or a derivative: the build tools, the
# libraries (hiredis 0.14, libsodium, OpenSSL's libcrypto, c-ares), the test framework (criterion) and redis-server for the
# tests, the bench and the fault suite (valgrind, iptables, iproute2; clang and libclang-rt-14-dev
# for the libFuzzer targets; libuv, libevent and libev for the event-loop adapters' tests;
# Python 3's headers, cffi, meson-python and pytest for the Python binding and its tests,
# redis-py for its bench; libmicrohttpd for redsem exporter and prometheus, whose promtool and
# server the metrics tests use). Idempotent: does nothing if all is installed.
# Runs apt-get as root, through sudo when not root.
set -eu
packages="gcc libc6-dev meson ninja-build pkg-config libhiredis-dev libsodium-dev libc-ares-dev libcriterion-dev libjansson-dev libssl-dev
redis-server openssl gnuplot-nox jq valgrind iptables iproute2 util-linux procps clang libclang-rt-14-dev
libuv1-dev libevent-dev libev-dev python3-dev python3-cffi python3-mesonpy python3-pytest python3-redis
libmicrohttpd-dev prometheus"
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
echo "tools/deps.sh: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
