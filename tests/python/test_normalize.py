"""Client.normalize against the float64 reference: every op, x dtype, y
dtype, affine form (none, gamma, beta, both; params in f32 or x's dtype),
residual, stats and eps mode, on fresh random shapes and data."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import lnorm
from reference import check, dtype_of, random

OPS = ["layernorm", "rmsnorm"]
DTYPES = ["f32", "f16", "bf16"]
AFFINE = ["none", "gamma", "beta", "both"]


@pytest.mark.parametrize("op,xd,yd,affine,with_residual",
                         list(itertools.product(OPS, DTYPES, DTYPES, AFFINE, [False, True])))
def test_matrix(client, rng, op, xd, yd, affine, with_residual):
    xdt, ydt = dtype_of(xd), dtype_of(yd)
    for pd, stats, eps_mode in itertools.product(["f32", xd], [False, True], ["inside", "outside"]):
        rows = int(rng.integers(1, 9))
        hidden = int(rng.choice([1, 3, 64, 257, 1024, 4096]))
        x = random(rng, (rows, hidden), xdt, mean=float(rng.uniform(-3, 3)), spread=float(rng.uniform(0.1, 4)))
        pdt = dtype_of(pd)
        gamma = random(rng, hidden, pdt, 1.0, 0.5) if affine in ("gamma", "both") else None
        beta = random(rng, hidden, pdt, 0.0, 0.5) if affine in ("beta", "both") else None
        residual = random(rng, (rows, hidden), xdt) if with_residual else None
        eps = float(rng.choice([1e-5, 1e-3, 0.25]))
        got = client.normalize(x, op, gamma=gamma, beta=beta, residual=residual, eps=eps,
                               eps_mode=eps_mode, stats=stats, out_dtype=ydt)
        label = f"{op} x={xd} y={yd} params={pd} {affine} residual={with_residual} stats={stats} " \
                f"eps={eps} {eps_mode} {rows}x{hidden}"
        if stats or with_residual:
            assert isinstance(got, lnorm.Normalized), label
            y, mean, rstd, res_out = got
        else:
            assert isinstance(got, np.ndarray), label
            y, mean, rstd, res_out = got, None, None, None
        assert y.dtype == ydt, label
        check(label, y, x, op, gamma, beta, residual, eps, eps_mode, mean, rstd, res_out, want_stats=stats)


@pytest.mark.parametrize("shape", [(4096,), (2, 3, 160), (1, 1, 1, 7)])
def test_shapes(client, rng, shape):
    """Every axis but the last is rows; the result keeps x's shape."""
    x = random(rng, shape, np.float32)
    r = client.normalize(x, "rms", stats=True)
    assert r.y.shape == shape and r.rstd.shape == shape[:-1]
    check(f"shape {shape}", r.y, x, "rmsnorm", rstd=r.rstd, want_stats=True)


def test_in_place_and_out(client, rng):
    """out= receives y with no new array; out=x normalizes in place."""
    x = random(rng, (5, 300), np.float32)
    keep = x.copy()
    out = np.empty_like(x)
    y = client.normalize(x, "ln", out=out)
    assert y is out
    check("out=", y, keep, "layernorm")
    y2 = client.normalize(x, "ln", out=x)
    assert y2 is x and np.shares_memory(y2, x)
    assert np.array_equal(x, out)


def test_non_contiguous_input(client, rng):
    """A strided view is copied once and gives the contiguous result."""
    base = random(rng, (6, 2 * 512), np.float16)
    view = base[:, ::2]
    assert not view.flags.c_contiguous
    y = client.normalize(view, "ln")
    assert np.array_equal(y, client.normalize(np.ascontiguousarray(view), "ln"))
    check("strided", y, np.ascontiguousarray(view), "layernorm")


def test_chunked_equals_whole(daemon, rng):
    """A call split into many chunks gives the bits of one whole request."""
    x = random(rng, (300, 1024), np.float32, 1.0, 2.0)
    with lnorm.Client(daemon.tcp_url, chunk_bytes=16 << 10) as small, lnorm.Client(daemon.tcp_url) as whole:
        a = small.normalize(x, "ln", stats=True)
        b = whole.normalize(x, "ln", stats=True)
    assert np.array_equal(a.y, b.y) and np.array_equal(a.rstd, b.rstd) and np.array_equal(a.mean, b.mean)
    check("chunked", a.y, x, "layernorm", mean=a.mean, rstd=a.rstd, want_stats=True)


def test_list_and_enum_arguments(client, rng):
    """Array-likes become float32; Op and EpsMode work like their names."""
    x = random(rng, (2, 16), np.float32)
    y = client.normalize(x.tolist(), lnorm.Op.RMSNORM, gamma=[2.0] * 16, eps_mode=lnorm.EpsMode.OUTSIDE)
    check("lists", y, x, "rmsnorm", gamma=np.full(16, 2.0, np.float32), eps_mode="outside")
