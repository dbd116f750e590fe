"""rediss:// against a private TLS redis-server (certificates from tests/support/gen-certs.sh):
verified connections, a refused certificate as redsem.TLSError, mutual TLS."""

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

import redsem
from conftest import _free_port, _redis_server_path

GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "support",
                   "gen-certs.sh")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    path = _redis_server_path()
    if path is None or shutil.which("openssl") is None:
        pytest.skip("no redis-server or openssl")
    d = str(tmp_path_factory.mktemp("tls"))
    subprocess.run(["sh", GEN, d], check=True)
    port = _free_port()
    proc = subprocess.Popen(
        [path, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", os.path.join(d, "server.crt"),
         "--tls-key-file", os.path.join(d, "server.key"),
         "--tls-ca-cert-file", os.path.join(d, "ca.crt"), "--tls-auth-clients", "optional",
         "--save", "", "--appendonly", "no", "--dir", d,
         "--logfile", os.path.join(d, "redis.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.skip("redis-server has no TLS")
            assert time.monotonic() < deadline, "TLS redis-server did not start"
            time.sleep(0.05)
    yield d, port
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(10)


def test_verified(tls_server, name):
    d, port = tls_server
    with redsem.Client(f"rediss://127.0.0.1:{port}", tls_ca=os.path.join(d, "ca.crt")) as c:
        c.ping()
        with c.semaphore(name, limit=1).acquire(timeout=1.0) as p:
            assert p.held
    with redsem.Client(f"rediss://localhost:{port}", tls_ca=os.path.join(d, "ca.crt"),
                       tls_cert=os.path.join(d, "client.crt"),
                       tls_key=os.path.join(d, "client.key")) as c:
        c.ping()


def test_refused_certificate(tls_server):
    d, port = tls_server
    with pytest.raises(redsem.TLSError):
        redsem.Client(f"rediss://127.0.0.1:{port}", tls_ca=os.path.join(d, "other-ca.crt"))
    with pytest.raises(redsem.TLSError):
        redsem.Client(f"rediss://127.0.0.1:{port}", tls_ca=os.path.join(d, "ca.crt"),
                      tls_server_name="wrong.example")
    # tests only: no verification at all
    with redsem.Client(f"rediss://127.0.0.1:{port}", tls_ca=os.path.join(d, "other-ca.crt"),
                       tls_insecure_skip_verify=True) as c:
        c.ping()
