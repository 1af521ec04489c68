"""Client.normalize_backward and AsyncClient.normalize_backward against a
float64 reference of the analytic gradient written here (bounds as in
tests/common/testbwd.h: f32 dx within 4e-6 of the scale of its terms,
f16/bf16 dx that plus one ulp; dgamma / dbeta within 4e-6 of the sums of
their terms' magnitudes), and against torch autograd where torch is."""
from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

import lnorm
from reference import BF16, dtype_of, random

RTOL = 4e-6


def grad_reference(x, dy, op, gamma=None, dres=None, eps=1e-5, eps_mode="inside"):
    """(dx, dgamma, dbeta, dx_scale, dgamma_scale, dbeta_scale) in float64."""
    h = x.astype(np.float64).reshape(-1, x.shape[-1])
    d = dy.astype(np.float64).reshape(h.shape)
    eps = float(np.float32(eps))
    mean = h.mean(axis=1, keepdims=True) if op == "layernorm" else np.zeros((h.shape[0], 1))
    c = h - mean
    var = (c * c).mean(axis=1, keepdims=True)
    sigma = np.sqrt(var)
    rstd = 1.0 / np.sqrt(var + eps) if eps_mode == "inside" else 1.0 / (sigma + eps)
    f = np.ones_like(rstd) if eps_mode == "inside" else sigma * rstd
    xh = c * rstd
    g = d * (1.0 if gamma is None else gamma.astype(np.float64))
    mg = g.mean(axis=1, keepdims=True) if op == "layernorm" else np.zeros_like(rstd)
    mgx = (g * xh).mean(axis=1, keepdims=True)
    k = np.where(f == 0, 0.0, mgx / np.where(f == 0, 1.0, f))
    dx = rstd * (g - mg - xh * k)
    scale = rstd * (np.abs(g) + (np.abs(g).mean(axis=1, keepdims=True) if op == "layernorm" else 0.0)
                    + (np.abs(xh) + 1.0) * np.where(f == 0, 0.0, np.abs(g * xh).mean(axis=1, keepdims=True) /
                                                    np.where(f == 0, 1.0, f)))
    if dres is not None:
        r = dres.astype(np.float64).reshape(h.shape)
        dx = dx + r
        scale = scale + np.abs(r)
    return (dx.reshape(x.shape), (d * xh).sum(axis=0), d.sum(axis=0), scale.reshape(x.shape),
            (np.abs(d) * (np.abs(xh) + 1.0)).sum(axis=0), np.abs(d).sum(axis=0))


def _ulp(v, dt):
    mant, emin = (10, -14) if dt == np.float16 else (7, -126)
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** emin)))
    return 2.0 ** (e - mant)


def check_grads(label, got, x, dy, op, gamma=None, dres=None, eps=1e-5, eps_mode="inside", want_dx=True,
                want_dgamma=True, want_dbeta=True):
    dx, dg, db, s, sg, sb = grad_reference(x, dy, op, gamma, dres, eps, eps_mode)
    if isinstance(got, lnorm.Gradients):
        gdx, gdg, gdb = got
    else:
        gdx, gdg, gdb = got, None, None
    if want_dx:
        a = np.asarray(gdx)
        assert a.shape == x.shape, f"{label}: dx shape {a.shape}"
        bound = RTOL * s + (0.0 if a.dtype == np.float32 else _ulp(dx, a.dtype))
        err = np.abs(a.astype(np.float64) - dx)
        ok = err <= bound
        assert ok.all(), (f"{label}: {int((~ok).sum())} dx elements off; worst "
                          f"{float(np.max(err / bound))} x the bound")
    else:
        assert gdx is None, label
    for name, want, got_v, sc, asked in (("dgamma", dg, gdg, sg, want_dgamma), ("dbeta", db, gdb, sb, want_dbeta)):
        if not asked:
            assert got_v is None, f"{label}: {name} returned though not asked for"
            continue
        a = np.asarray(got_v)
        assert a.dtype == np.float32 and a.shape == (x.shape[-1],), f"{label}: {name} {a.dtype} {a.shape}"
        ok = np.abs(a.astype(np.float64) - want) <= RTOL * sc + 1e-30
        assert ok.all(), f"{label}: {int((~ok).sum())} {name} elements off"


OPS = ["layernorm", "rmsnorm"]
DTYPES = ["f32", "f16", "bf16"]


@pytest.mark.parametrize("op,xd,dyd,dxd", list(itertools.product(OPS, DTYPES, ["x", "f32"], ["x", "f32"])))
def test_matrix(client, rng, op, xd, dyd, dxd):
    xdt = dtype_of(xd)
    dydt = xdt if dyd == "x" else np.float32
    dxdt = None if dxd == "x" else np.float32
    for with_gamma, with_dres, stats, eps_mode in itertools.product([False, True], [False, True], [False, True],
                                                                    ["inside", "outside"]):
        rows = int(rng.integers(1, 7))
        hidden = int(rng.choice([1, 5, 64, 257, 1024]))
        x = random(rng, (rows, hidden), xdt, mean=float(rng.uniform(-2, 2)), spread=float(rng.uniform(0.2, 3)))
        dy = random(rng, (rows, hidden), dydt)
        gamma = random(rng, hidden, np.float32, 1.0, 0.5) if with_gamma else None
        dres = random(rng, (rows, hidden), xdt) if with_dres else None
        eps = float(rng.choice([1e-5, 1e-2]))
        mean = rstd = None
        if stats:
            fwd = client.normalize(x, op, eps=eps, eps_mode=eps_mode, stats=True)
            mean, rstd = fwd.mean, fwd.rstd
        got = client.normalize_backward(x, dy, op, gamma=gamma, dres=dres, mean=mean, rstd=rstd, eps=eps,
                                        eps_mode=eps_mode, dx_dtype=dxdt, dgamma=True, dbeta=True)
        assert isinstance(got, lnorm.Gradients)
        assert got.dx.dtype == (xdt if dxdt is None else dxdt)
        check_grads(f"{op} x={xd} dy={dyd} dx={dxd} gamma={with_gamma} dres={with_dres} stats={stats} "
                    f"{eps_mode} {rows}x{hidden}", got, x, dy, op, gamma, dres, eps, eps_mode)


def test_outputs_asked_for(client, rng):
    x = random(rng, (4, 300), np.float32)
    dy = random(rng, (4, 300), np.float32)
    dx = client.normalize_backward(x, dy, "ln")
    assert isinstance(dx, np.ndarray)
    check_grads("dx only", dx, x, dy, "layernorm", want_dgamma=False, want_dbeta=False)
    g = client.normalize_backward(x, dy, "rms", dx=False, dbeta=True)
    assert g.dx is None and g.dgamma is None and g.dbeta is not None
    check_grads("dbeta only", g, x, dy, "rmsnorm", want_dx=False, want_dgamma=False)
    out = np.empty_like(x)
    r = client.normalize_backward(x, dy, "ln", out=out)
    assert r is out


def test_shapes_and_params_id(client, rng):
    x = random(rng, (2, 3, 96), BF16)
    dy = random(rng, (2, 3, 96), BF16)
    gamma = random(rng, 96, np.float32, 1.0, 0.3)
    client.register_params("py-bwd", gamma=gamma)
    try:
        g = client.normalize_backward(x, dy, "layernorm", params_id="py-bwd", dgamma=True)
        check_grads("params id, 3-D", g, x, dy, "layernorm", gamma, want_dbeta=False)
        assert g.dx.shape == x.shape
    finally:
        client.drop_params("py-bwd")


def test_chunked(daemon, rng):
    """A call split into many requests: dx exact per chunk, dgamma / dbeta summed by liblnorm."""
    with lnorm.Client(daemon.ipc_url, chunk_bytes=16 * 1024) as c:
        x = random(rng, (300, 512), np.float32)
        dy = random(rng, (300, 512), np.float32)
        g = c.normalize_backward(x, dy, "ln", dgamma=True, dbeta=True)
        check_grads("chunked", g, x, dy, "layernorm")
        again = c.normalize_backward(x, dy, "ln", dgamma=True, dbeta=True)
        assert np.array_equal(g.dgamma.view(np.uint32), again.dgamma.view(np.uint32)), "bits differ between repeats"


def test_async(daemon, rng):
    async def main():
        async with lnorm.AsyncClient(daemon.ipc_url) as c:
            cases = []
            for i in range(24):
                x = random(rng, (int(rng.integers(1, 5)), 256), np.float32)
                dy = random(rng, x.shape, np.float32)
                op = OPS[i % 2]
                cases.append((x, dy, op, c.normalize_backward(x, dy, op, dgamma=True, dbeta=True)))
            results = await asyncio.gather(*(co for _, _, _, co in cases))
            for (x, dy, op, _), r in zip(cases, results):
                check_grads(f"async {op}", r, x, dy, op)
            # forward and backward in flight together
            x = random(rng, (3, 128), np.float32)
            y, g = await asyncio.gather(c.normalize(x, "ln"), c.normalize_backward(x, x, "ln", dgamma=True))
            check_grads("async mixed", g, x, x, "layernorm", want_dbeta=False)
    asyncio.run(main())


def test_errors(client, rng):
    x = random(rng, (2, 8), np.float32)
    with pytest.raises(lnorm.InvalidArgument, match="dy"):
        client.normalize_backward(x, np.zeros((2, 9), np.float32))
    with pytest.raises(lnorm.InvalidArgument, match="no output"):
        client.normalize_backward(x, x, dx=False)
    with pytest.raises(lnorm.InvalidArgument, match="mean"):
        client.normalize_backward(x, x, "rms", mean=np.zeros(2, np.float32), rstd=np.ones(2, np.float32))
    with pytest.raises(lnorm.InvalidArgument, match="rstd"):
        client.normalize_backward(x, x, rstd=np.ones(3, np.float32))
    with pytest.raises(lnorm.InvalidArgument, match="float32"):
        client.normalize_backward(x, x, mean=np.zeros(2, np.float16), rstd=np.ones(2, np.float16))
    with pytest.raises(lnorm.InvalidArgument, match="gamma"):
        client.normalize_backward(x, x, gamma=np.ones(7, np.float32))
    with pytest.raises(lnorm.NotFound, match="nobody"):
        client.normalize_backward(x, x, params_id="nobody")
    with pytest.raises(lnorm.InvalidArgument, match="eps"):
        client.normalize_backward(x, x, eps=1e-39, eps_mode="outside")


def test_torch_autograd(client, rng):
    """Against torch's own gradients of layer_norm / an RMSNorm written in torch."""
    torch = pytest.importorskip("torch")
    for op in OPS:
        x = torch.randn(6, 384, dtype=torch.float64)
        w = (torch.rand(384, dtype=torch.float64) + 0.5)
        dy = torch.randn(6, 384, dtype=torch.float64)
        xr = x.clone().requires_grad_(True)
        wr = w.clone().requires_grad_(True)
        if op == "layernorm":
            y = torch.nn.functional.layer_norm(xr, (384,), wr, None, eps=1e-5)
        else:
            y = xr * torch.rsqrt((xr * xr).mean(-1, keepdim=True) + 1e-5) * wr
        y.backward(dy)
        g = client.normalize_backward(x.float(), dy.float(), op, gamma=w.float(), dgamma=True, dbeta=True)
        assert torch.allclose(g.dx.double(), xr.grad, rtol=1e-4, atol=1e-5), op
        assert torch.allclose(g.dgamma.double(), wr.grad, rtol=1e-4, atol=1e-4), op
        assert torch.allclose(g.dbeta.double(), dy.sum(0), rtol=1e-4, atol=1e-4), op
