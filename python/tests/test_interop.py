"""A Python process, a C program (interop-worker) and `redsem run` share one semaphore of
limit 3 under load; a witness outside Redis (witness.py: a counter file under flock)
counts the holders: never above 3."""

import os
import shlex
import subprocess
import sys
import threading
import time

import pytest

import redsem

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import witness  # noqa: E402

LIMIT = 3


def test_python_c_and_cli_share_a_semaphore(server, client, name, tmp_path):
    worker = os.environ.get("REDSEM_INTEROP_WORKER")
    cli = os.environ.get("REDSEM_BIN")
    if not worker or not cli:
        pytest.skip("REDSEM_INTEROP_WORKER and REDSEM_BIN are set by meson test")
    wfile = str(tmp_path / "witness")
    with open(wfile, "w") as f:
        f.write("0 0\n")
    sem = client.semaphore(name, limit=LIMIT, lease=10.0, strategy="fair")

    # C: two processes, 25 sections each
    cprocs = [subprocess.Popen([worker, server.url, name, str(LIMIT), wfile, "25", "5000"])
              for _ in range(2)]

    # the CLI: two loops of `redsem run`, 6 commands each
    section = (f"{shlex.quote(sys.executable)} {shlex.quote(witness.__file__)} "
               f"{shlex.quote(wfile)}")
    cmd = f"{section} enter && sleep 0.005 && {section} leave"
    errors = []

    def cli_loop():
        for _ in range(6):
            rc = subprocess.call([cli, "run", "--url", server.url, "--limit", str(LIMIT),
                                  "--lease", "10s", "--wait", "120s", name, "--",
                                  "sh", "-c", cmd])
            if rc != 0:
                errors.append(f"redsem run exited {rc}")

    # Python: three threads sharing this process's client, 25 sections each
    def py_loop():
        try:
            for _ in range(25):
                with sem.acquire(timeout=120.0):
                    witness.update(wfile, +1)
                    time.sleep(0.005)
                    witness.update(wfile, -1)
        except redsem.Error as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=cli_loop) for _ in range(2)]
    threads += [threading.Thread(target=py_loop) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for p in cprocs:
        assert p.wait(600) == 0
    assert not errors
    cur, mx = witness.read(wfile)
    assert cur == 0
    assert 1 <= mx <= LIMIT, f"{mx} holders at once, limit {LIMIT}"
    assert sem.status().holder_count == 0
