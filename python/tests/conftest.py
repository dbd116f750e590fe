"""pytest fixtures of the binding's tests: one private redis-server per session, on a unix
socket (and a loopback port) in a temporary directory, stopped by its pid at the end (as
tests/support/fixture.c does for the C tests). Without redis-server every test is skipped."""

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import redsem

_names = itertools.count(1)


def _redis_server_path():
    env = os.environ.get("REDSEM_REDIS_SERVER")
    if env:
        return env if os.access(env, os.X_OK) else None
    for cand in ("/usr/bin/redis-server", "/usr/local/bin/redis-server",
                 "/usr/sbin/redis-server"):
        if os.access(cand, os.X_OK):
            return cand
    return shutil.which("redis-server")


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, path):
        self.dir = tempfile.mkdtemp(prefix="redsem-py-")
        self.sock = os.path.join(self.dir, "redis.sock")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [path, "--port", str(self.port), "--bind", "127.0.0.1", "--unixsocket", self.sock,
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--enable-debug-command", "local", "--dir", self.dir,
             "--logfile", os.path.join(self.dir, "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.command(b"PING")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.02)
        self.url = "unix://" + self.sock
        self.tcp_url = f"redis://127.0.0.1:{self.port}"

    def command(self, *args):
        """Send one command (bulk strings) and return the first reply line (no parser:
        enough for PING, FLUSHALL, DEBUG SLEEP)."""
        req = b"*%d\r\n" % len(args) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(self.sock)
            s.sendall(req)
            return s.recv(4096).split(b"\r\n")[0]

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    path = _redis_server_path()
    if path is None:
        pytest.skip("no redis-server")
    srv = Server(path)
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = redsem.Client(server.url)
    yield c
    c.close()


@pytest.fixture
def name(request):
    """A name no other test uses: <test>-<pid>-<n>."""
    base = request.node.name.replace("[", "-").replace("]", "")[:60]
    return f"{base}-{os.getpid()}-{next(_names)}"
