"""The checker itself: it must refuse outputs with the mistakes a backend or
the binding could make (eps in the wrong place, a few ulps off, rows or
parameters swapped, a stale residual_out), so that the other tests can fail."""
from __future__ import annotations

import numpy as np
import pytest

from reference import BF16, check, reference, random


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_checker_refuses_wrong_outputs(rng, dtype):
    x = random(rng, (4, 512), dtype, 2.0, 1.5)
    gamma = random(rng, 512, np.float32, 1.0, 0.5)
    y, mean, rstd, _, _, _, _ = reference(x, "layernorm", gamma, eps=0.1)
    good = y.astype(np.float32).astype(dtype)
    check("exact", good, x, "layernorm", gamma, eps=0.1)
    wrong = {
        "eps outside": reference(x, "layernorm", gamma, eps=0.1, eps_mode="outside")[0],
        "no gamma": reference(x, "layernorm", eps=0.1)[0],
        "rms for ln": reference(x, "rmsnorm", gamma, eps=0.1)[0],
        "rows swapped": y[::-1],
        "gamma reversed": reference(x, "layernorm", gamma[::-1].copy(), eps=0.1)[0],
    }
    for what, bad in wrong.items():
        with pytest.raises(AssertionError):
            check(what, bad.astype(np.float32).astype(dtype), x, "layernorm", gamma, eps=0.1)
    ulps = good.copy()
    if dtype == np.float32:  # 20 times the tolerance
        ulps[1, 7] += np.float32(2e-5) * np.abs(good[1]).max()
    else:  # three ulps up, in the dtype's own bits
        ulps.view(np.uint16)[1, 7] += 3
    with pytest.raises(AssertionError):
        check("ulps", ulps, x, "layernorm", gamma, eps=0.1)
    with pytest.raises(AssertionError):
        check("rstd", good, x, "layernorm", gamma, eps=0.1, mean=mean.astype(np.float32),
              rstd=(rstd * (1 + 1e-5)).astype(np.float32), want_stats=True)


def test_checker_refuses_stale_residual_out(rng):
    x = random(rng, (2, 64), BF16)
    r = random(rng, (2, 64), BF16)
    y, _, _, ro, _, _, _ = reference(x, "rmsnorm", residual=r)
    check("good", y.astype(np.float32).astype(BF16), x, "rmsnorm", residual=r, residual_out=ro)
    with pytest.raises(AssertionError):
        check("stale", y.astype(np.float32).astype(BF16), x, "rmsnorm", residual=r, residual_out=x)
