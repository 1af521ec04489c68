"""One client from many threads, and the asyncio client with many calls in
flight: every reply checked against the reference."""
from __future__ import annotations

import asyncio
import socket
import threading

import numpy as np
import pytest

import lnorm
from reference import check, random


def test_threads(client, rng):
    n_threads, calls = 8, 12
    seeds = rng.integers(0, 1 << 31, n_threads)
    failures = []

    def worker(seed):
        g = np.random.default_rng(seed)
        try:
            for i in range(calls):
                x = random(g, (int(g.integers(1, 6)), int(g.choice([64, 1000, 2048]))), np.float32)
                gamma = random(g, x.shape[1], np.float32, 1.0, 0.2)
                op = "layernorm" if i % 2 else "rmsnorm"
                r = client.normalize(x, op, gamma=gamma, stats=True)
                check(f"thread {seed} call {i}", r.y, x, op, gamma, mean=r.mean, rstd=r.rstd, want_stats=True)
        except Exception as e:  # reported below, with the thread's seed
            failures.append(f"{seed}: {e!r}")

    threads = [threading.Thread(target=worker, args=(int(s),)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures


def test_asyncio_gather(daemon, rng):
    xs = [random(rng, (int(rng.integers(1, 5)), 512), lnorm.bfloat16, 0.5, 2.0) for _ in range(48)]

    async def main():
        async with lnorm.AsyncClient(daemon.tcp_url) as c:
            assert await c.health()
            info = await c.info()
            ys = await asyncio.gather(*[c.normalize(x, "ln", stats=True, out_dtype=np.float32) for x in xs])
            with pytest.raises(lnorm.InvalidArgument):
                await c.normalize(xs[0], eps=-1.0)
            await c.register_params("py.async", np.ones(512, np.float32))
            with pytest.raises(lnorm.AlreadyExists):
                await c.register_params("py.async", np.ones(512, np.float32))
            y = await c.normalize(xs[0], "ln", params_id="py.async")
            await c.drop_params("py.async")
            return info, ys, y

    info, ys, y = asyncio.run(main())
    assert info.backends == ["cpu"]
    for i, (x, r) in enumerate(zip(xs, ys)):
        check(f"async {i}", r.y, x, "layernorm", mean=r.mean, rstd=r.rstd, want_stats=True)
    check("async params", y, xs[0], "layernorm", gamma=np.ones(512, np.float32))


def silent_server(path: str) -> socket.socket:
    """An SP peer on a unix socket that does the REP handshake and never answers."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)

    def serve() -> None:
        conns = []
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                break
            conn.sendall(b"\x00SP\x00\x00\x31\x00\x00")  # REP0
            conns.append(conn)  # (read by nobody: requests go unanswered)
        for conn in conns:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_asyncio_close_fails_calls_in_flight(tmp_path):
    """Calls waiting on a server that never answers end in ObjectClosed at close."""
    srv = silent_server(f"{tmp_path}/silent.sock")

    async def main():
        c = lnorm.AsyncClient(f"ipc://{tmp_path}/silent.sock", send_timeout_ms=20000, timeout_ms=20000)
        calls = [asyncio.ensure_future(c.normalize(np.ones((1, 8), np.float32))) for _ in range(4)]
        await asyncio.sleep(0.2)
        await c.close()
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        results = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        srv.close()
    assert all(isinstance(r, lnorm.ObjectClosed) for r in results), results
