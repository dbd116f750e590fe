#!/usr/bin/env python3
"""Python binding bench: acquire+release pairs/s of the binding against redis-py's Lock
(the python3-redis package) on the same server in the same run, and against the C
library's own pair (redsem-bench's uncontended workload), in interleaved rounds.

    PYTHONPATH=build/python python3 bench/python/bench.py [--redsem-bench build/bench/redsem-bench]
        [--pairs N] [--rounds N] [--sock PATH] [--json FILE]

With no --sock it starts a private redis-server on a unix socket in a temporary directory
(stopped by its pid at the end). Each round alternates the binding's lock, redis-py's Lock,
the binding's basic semaphore and the C lock pair called straight through cffi (without the
binding's Python layer) in chunks of 500 pairs (so the machine's noise hits them
alike), and runs redsem-bench (-w uncontended -s basic,lock --rounds 1 --affinity none: one
process, unpinned as the Python one) in its middle; figures are the medians over the
rounds, and the ratios the medians of the per-round ratios. Targets (issue 27): binding lock >= 1.5x redis-py's
Lock; binding pair within 1.3x of the C pair (C/binding <= 1.3).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import redsem

try:
    import redis
except ImportError:  # python3-redis: tools/deps.sh installs it
    redis = None


def start_server():
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    d = tempfile.mkdtemp(prefix="redsem-pybench-")
    sock = os.path.join(d, "redis.sock")
    proc = subprocess.Popen([path, "--port", "0", "--unixsocket", sock, "--unixsocketperm",
                             "700", "--save", "", "--appendonly", "no", "--dir", d,
                             "--logfile", os.path.join(d, "redis.log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        if time.monotonic() > deadline or proc.poll() is not None:
            sys.exit("redis-server did not start")
        time.sleep(0.02)
    time.sleep(0.1)
    return proc, d, sock


def binding_lock(client, name):
    lk = client.lock(name, lease=10.0)

    def run(n):
        for _ in range(n):
            p = lk.acquire(0)
            p.release()
    return run


def binding_sem(client, name):
    sem = client.semaphore(name, limit=1, lease=10.0, strategy="basic")

    def run(n):
        for _ in range(n):
            p = sem.acquire(0)
            p.release()
    return run


def ffi_lock(client, name):
    """The C library's lock pair called straight through cffi, without the binding's Python
    layer: what the binding adds is the difference (interleaved, so it is not noise)."""
    from redsem._redsem import ffi, lib
    lk = client.lock(name, lease=10.0)
    ptr = lk._node.ptr
    pp = ffi.new("redsem_permit **")

    def run(n):
        for _ in range(n):
            if lib.redsem_lock_acquire(ptr, 0, pp) != 0:
                raise RuntimeError("lock not acquired")
            lib.redsem_permit_release(pp[0])
            lib.redsem_permit_free(pp[0])
    run.keep = lk  # the handle outlives the loop
    return run


def redispy_lock(r, name):
    def run(n):
        for _ in range(n):
            lk = r.lock(name, timeout=10)
            if not lk.acquire(blocking=False):
                raise RuntimeError("redis-py lock not acquired")
            lk.release()
    return run


def c_pairs(bench, url, pairs):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([bench, "--url", url, "--affinity", "none", "-w", "uncontended", "-s", "basic,lock",
                        "--pairs", str(pairs), "--rounds", "1", "--json", f.name, "-q"],
                       check=True, stdout=subprocess.DEVNULL)
        data = json.load(open(f.name))
    rows = data["uncontended"]
    return {row["strategy"]: row["pairs_per_s"] for row in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redsem-bench", default=os.environ.get("REDSEM_BENCH"))
    ap.add_argument("--pairs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sock", help="use this redis-server's unix socket")
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()
    if redis is None:
        sys.exit("redis-py is missing (python3-redis)")
    proc = None
    d = None
    sock = a.sock
    if sock is None:
        proc, d, sock = start_server()
    url = "unix://" + sock
    try:
        client = redsem.Client(url)
        r = redis.Redis(unix_socket_path=sock)
        tag = f"pybench-{os.getpid()}"
        runs = {"binding_lock": binding_lock(client, tag + "-lock"),
                "redispy_lock": redispy_lock(r, tag + "-redispy"),
                "binding_basic": binding_sem(client, tag + "-basic"),
                "ffi_lock": ffi_lock(client, tag + "-ffi")}
        rows = []
        for fn in runs.values():
            fn(200)  # warm-up: scripts loaded, connections open
        chunk = max(1, min(500, a.pairs // 10))
        for i in range(a.rounds):
            # the Python workloads alternate in chunks (the machine's noise hits them
            # alike); redsem-bench runs in the middle of the round
            secs = {k: 0.0 for k in runs}
            cpu = {k: 0.0 for k in runs}
            done = 0
            c = None
            while done < a.pairs:
                n = min(chunk, a.pairs - done)
                for k, fn in runs.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn(n)
                    secs[k] += time.perf_counter() - t0
                    cpu[k] += time.process_time() - c0
                done += n
                if a.redsem_bench and c is None and done >= a.pairs // 2:
                    c = c_pairs(a.redsem_bench, url, a.pairs)
            row = {k: a.pairs / v for k, v in secs.items()}
            row.update({k + "_cpu_us": v * 1e6 / a.pairs for k, v in cpu.items()})
            if c is not None:
                row["c_basic"] = c.get("basic")
                row["c_lock"] = c.get("lock")
            rows.append(row)
            print(f"round {i + 1}: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()
                                                 if not k.endswith("_cpu_us")),
                  file=sys.stderr)

        def med(k):
            return statistics.median(row[k] for row in rows)

        def ratio(num, den):
            return statistics.median(row[num] / row[den] for row in rows)

        out = {k: med(k) for k in rows[0]}
        out["binding_lock_vs_redispy"] = ratio("binding_lock", "redispy_lock")
        out["ffi_vs_binding_lock"] = ratio("ffi_lock", "binding_lock")
        if a.redsem_bench:
            out["c_vs_binding_basic"] = ratio("c_basic", "binding_basic")
            out["c_vs_binding_lock"] = ratio("c_lock", "binding_lock")
        out["rounds"] = a.rounds
        out["pairs"] = a.pairs
        print(f"pairs/s, medians of {a.rounds} rounds of {a.pairs} pairs (unix socket):")
        for k in ("binding_lock", "redispy_lock", "binding_basic", "ffi_lock", "c_lock",
                  "c_basic"):
            if k in out:
                print(f"  {k:<15} {out[k]:>10,.0f}")
        print("client CPU per pair, us (this process; medians):")
        for k in runs:
            print(f"  {k:<15} {out[k + '_cpu_us']:>10.1f}")
        print(f"  binding lock / redis-py Lock: {out['binding_lock_vs_redispy']:.2f}x "
              "(target >= 1.5)")
        print(f"  C via cffi / binding, lock: {out['ffi_vs_binding_lock']:.2f}x "
              "(the binding's own cost, interleaved)")
        if a.redsem_bench:
            print(f"  C / binding, basic pair:    {out['c_vs_binding_basic']:.2f}x "
                  "(target <= 1.3)")
            print(f"  C / binding, lock pair:     {out['c_vs_binding_lock']:.2f}x "
                  "(target <= 1.3)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        if proc is not None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(10)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
