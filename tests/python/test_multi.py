"""Several daemons behind one client: lnorm.Client([url, url, ...]) spreads
the calls over them and moves on when one drains (SIGTERM): no call fails."""
from __future__ import annotations

import signal
import threading
import urllib.request

import numpy as np

import lnorm
from conftest import start_daemon, stop_daemon
from reference import reference


def served(http: str) -> float:
    body = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    line = next(ln for ln in body.splitlines() if ln.startswith("lnormd_normalize_ok_total "))
    return float(line.split()[1])


def test_spread_and_drain():
    a, b = start_daemon(), start_daemon()
    try:
        with lnorm.Client([a.ipc_url, b.tcp_url], timeout_ms=20000) as c:
            stop = threading.Event()
            problems: list = []
            counts = [0] * 4

            def work(k: int) -> None:
                g = np.random.default_rng(k)
                while not stop.is_set():
                    x = g.standard_normal((8, 256)).astype(np.float32)
                    try:
                        y = c.normalize(x, "layernorm")
                        err = np.abs(y.astype(np.float64) - reference(x, "layernorm")[0]).max()
                        if err > 1e-4:
                            problems.append(f"error {err}")
                        counts[k] += 1
                    except lnorm.Error as e:
                        problems.append(repr(e))

            threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            stop.wait(1.0)
            before = served(a.http), served(b.http)
            a.proc.send_signal(signal.SIGTERM)  # drains: late requests get UNAVAILABLE
            a.proc.wait(timeout=20)
            after_drain = served(b.http)
            stop.wait(1.0)
            stop.set()
            for t in threads:
                t.join()
            assert a.proc.returncode == 0
            assert not problems, problems[:3]
            assert sum(counts) > 0 and before[0] > 0 and before[1] > 0, (counts, before)
            assert served(b.http) > after_drain
    finally:
        stop_daemon(a)
        stop_daemon(b)
