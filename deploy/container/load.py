"""Load for deploy/container/smoke.sh: async LayerNorm calls for some
seconds, each checked against numpy; prints the tally (ok, wrong, errors by
class). Exits 1 when a result was wrong or none came back.
    python load.py URL SECONDS"""
import asyncio
import collections
import sys
import time

import numpy as np

import lnorm


async def main(url: str, seconds: float) -> int:
    ok, wrong, errors = 0, 0, collections.Counter()
    end = time.monotonic() + seconds
    rng = np.random.default_rng()
    async with lnorm.AsyncClient(url, timeout_ms=3000, send_timeout_ms=1000) as c:
        async def one():
            nonlocal ok, wrong
            while time.monotonic() < end:
                x = rng.standard_normal((4, 1024)).astype(np.float32)
                try:
                    y = await c.normalize(x, "ln")
                except lnorm.Error as e:
                    errors[type(e).__name__] += 1
                    await asyncio.sleep(0.05)
                    continue
                h = x.astype(np.float64)
                ref = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5)
                if np.abs(y - ref).max() <= 1e-5:
                    ok += 1
                else:
                    wrong += 1
        await asyncio.gather(*[one() for _ in range(16)])
    print(f"ok {ok}\nwrong {wrong}\nerrors {dict(errors)}")
    return 0 if ok and not wrong else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], float(sys.argv[2]))))
