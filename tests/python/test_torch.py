"""torch CPU tensors in and out (skipped, and reported so, without torch)."""
from __future__ import annotations

import numpy as np
import pytest

import lnorm
from reference import check, random

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_tensor_round_trip(client, rng, dtype):
    tdt = getattr(torch, dtype)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(int(rng.integers(1 << 31)))).to(tdt)
    gamma = torch.rand(256) + 0.5
    r = client.normalize(x, "ln", gamma=gamma, stats=True)
    assert isinstance(r.y, torch.Tensor) and r.y.dtype == tdt and r.y.shape == x.shape
    assert isinstance(r.rstd, torch.Tensor) and r.rstd.shape == (3,)
    xn = x.view(torch.int16).numpy().view(lnorm.bfloat16) if dtype == "bfloat16" else x.numpy()
    yn = r.y.view(torch.int16).numpy().view(xn.dtype) if dtype == "bfloat16" else r.y.numpy()
    check(f"torch {dtype}", yn, xn, "layernorm", gamma.numpy(), mean=r.mean.numpy(), rstd=r.rstd.numpy(),
          want_stats=True)
    ref = torch.nn.functional.layer_norm(x.float(), (256,), gamma, eps=1e-5)
    assert torch.allclose(r.y.float(), ref, atol=3e-2 if dtype != "float32" else 1e-5)


def test_in_place_tensor(client):
    x = torch.randn(2, 64)
    keep = x.clone()
    client.normalize(x, "rms", out=x)
    assert torch.allclose(x, torch.nn.functional.rms_norm(keep, (64,), eps=1e-5), atol=1e-5)
