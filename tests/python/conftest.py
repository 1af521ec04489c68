"""Fixtures of the Python client's tests: a real lnormd (CPU backend) in a
private folder, started once per session, and a client dialed to it.

Environment (set by run.sh): LNORMD, the daemon's path (or LNORM_TEST_URL, one already serving); LNORM_LIBRARY,
liblnorm; LNORM_TEST_SEED repeats a run's random data (printed at start)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Iterator, List, Optional

import numpy as np
import pytest

import lnorm


@dataclass
class Daemon:
    proc: Optional[subprocess.Popen]
    folder: str
    urls: List[str]
    ipc_url: str
    tcp_url: str
    http: str

    def log(self) -> str:
        with open(os.path.join(self.folder, "log"), errors="replace") as f:
            return f.read()


def start_daemon(*args: str) -> Daemon:
    """Start lnormd on an ipc socket and a free tcp port; wait for its ready file."""
    folder = tempfile.mkdtemp(prefix="lnorm-py-")
    ready = os.path.join(folder, "ready")
    ipc = f"ipc://{folder}/lnormd.sock"
    log = open(os.path.join(folder, "log"), "w")
    proc = subprocess.Popen([os.environ["LNORMD"], "--backend", "cpu", "--cpu-threads", "2",
                             "--listen", ipc, "--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0",
                             "--ready-file", ready, *args], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (os.path.exists(ready) and os.path.getsize(ready) > 0):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"lnormd did not start:\n{open(log.name).read()}")
        time.sleep(0.02)
    lines = open(ready).read().split("\n")
    urls = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("listen ")]
    http = next(ln.split(" ", 1)[1] for ln in lines if ln.startswith("http "))
    return Daemon(proc, folder, urls, ipc, next(u for u in urls if u.startswith("tcp://")), http)


def stop_daemon(d: Daemon) -> int:
    """SIGTERM (lnormd drains), then the exit status."""
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
    status = d.proc.returncode
    shutil.rmtree(d.folder, ignore_errors=True)
    return status


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    external = os.environ.get("LNORM_TEST_URL")
    if external:  # a daemon started elsewhere (deploy/container/smoke.sh)
        yield Daemon(None, "", [external], external, external, "")
        return
    d = start_daemon()
    yield d
    log = d.log()
    status = stop_daemon(d)
    assert status == 0, f"lnormd exited {status} on SIGTERM:\n{log}"
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, log


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> Iterator[lnorm.Client]:
    with lnorm.Client(daemon.ipc_url, timeout_ms=20000) as c:
        yield c


_SEED = int(os.environ.get("LNORM_TEST_SEED", str(int.from_bytes(os.urandom(4), "little"))))


def pytest_report_header(config) -> str:
    return f"random data seed: LNORM_TEST_SEED={_SEED}"


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Fresh random data per test, repeatable with LNORM_TEST_SEED."""
    return np.random.default_rng([_SEED, zlib.crc32(request.node.nodeid.encode())])
