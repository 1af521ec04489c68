"""The float64 reference of lnormd's numerics and the checker, in numpy,
with the tolerances of tests/common/testutil.h (the C tests' checker):
f32 y within 1e-6 * (|gamma| * R + |beta|), R the row's largest normalized
|value|; f16/bf16 y within one ulp of the correctly rounded reference (or
that bound plus half an ulp for values tiny next to the row); mean and rstd
within 1e-6 relative; residual_out bit-exact."""
from __future__ import annotations

from typing import Optional

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def reference(x, op: str, gamma=None, beta=None, residual=None, eps: float = 1e-5,
              eps_mode: str = "inside"):
    """(y, mean, rstd, residual_out, R) in float64 over the last axis; the
    residual sum is one fp32 add rounded to x's dtype, as the core defines it."""
    if residual is not None:
        res_out = (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
        h = res_out.astype(np.float64)
    else:
        res_out = None
        h = x.astype(np.float64)
    eps = float(np.float32(eps))
    if op == "layernorm":
        mean = h.mean(axis=-1, keepdims=True)
    else:
        mean = np.zeros(h.shape[:-1] + (1,))
    c = h - mean
    var = (c * c).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps) if eps_mode == "inside" else 1.0 / (np.sqrt(var) + eps)
    n = c * rstd
    R = np.abs(n).max(axis=-1, keepdims=True)
    g = np.ones(h.shape[-1]) if gamma is None else gamma.astype(np.float64)
    b = np.zeros(h.shape[-1]) if beta is None else beta.astype(np.float64)
    y = n * g + b
    return y, mean[..., 0], rstd[..., 0], res_out, R, g, b


def _ulp(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    mant, emin = (10, -14) if dt == np.float16 else (7, -126)
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** emin)))
    return 2.0 ** (e - mant)


def _ordered(a: np.ndarray) -> np.ndarray:
    bits = a.view(np.uint16).astype(np.int64)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


def check(label: str, got, x, op: str, gamma=None, beta=None, residual=None, eps: float = 1e-5,
          eps_mode: str = "inside", mean=None, rstd=None, residual_out=None,
          want_stats: bool = False) -> None:
    """Assert that a normalize result matches the reference; the message names
    the first mismatching element."""
    y_ref, m_ref, r_ref, ro_ref, R, g, b = reference(x, op, gamma, beta, residual, eps, eps_mode)
    got = np.asarray(got)
    assert got.shape == x.shape, f"{label}: y shape {got.shape}, want {x.shape}"
    bound = 1e-6 * (np.abs(g) * R + np.abs(b))
    y64 = got.astype(np.float64)
    if got.dtype == np.float32:
        ok = np.abs(y64 - y_ref) <= bound
    else:
        want = y_ref.astype(np.float32).astype(got.dtype) if got.dtype == BF16 else y_ref.astype(got.dtype)
        ok = np.abs(_ordered(got) - _ordered(want)) <= 1
        ok |= np.abs(y64 - y_ref) <= bound + 0.5 * _ulp(y_ref, got.dtype)
        ok &= ~np.isnan(y64)
    if not ok.all():
        i = np.unravel_index(np.argmin(ok), ok.shape)
        raise AssertionError(f"{label}: {int((~ok).sum())} of {ok.size} y elements off; first at {i}: "
                             f"got {y64[i]!r} want {y_ref[i]!r} (bound {bound[i]!r})")
    if want_stats:
        assert rstd is not None and rstd.dtype == np.float32 and rstd.shape == x.shape[:-1], label
        bad = ~(np.abs(rstd - r_ref) <= 1e-6 * r_ref)
        assert not bad.any(), f"{label}: rstd off: got {rstd[bad][:3]} want {r_ref[bad][:3]}"
        if op == "layernorm":
            assert mean is not None and mean.shape == x.shape[:-1], label
            bad = ~(np.abs(mean - m_ref) <= 1e-6 * (np.abs(m_ref) + 1.0 / r_ref))
            assert not bad.any(), f"{label}: mean off: got {mean[bad][:3]} want {m_ref[bad][:3]}"
        else:
            assert mean is None, f"{label}: RMSNorm returned a mean"
    else:
        assert mean is None and rstd is None, f"{label}: stats returned unasked"
    if residual is not None:
        assert residual_out is not None and residual_out.dtype == x.dtype, label
        assert np.array_equal(residual_out.view(np.uint8), ro_ref.view(np.uint8)), \
            f"{label}: residual_out differs from one rounding of x + residual"
    else:
        assert residual_out is None, label


def random(rng: np.random.Generator, shape, dtype, mean: float = 0.0, spread: float = 1.0,
           ) -> np.ndarray:
    """Normal data of a dtype (f32, f16, bf16), each value rounded once."""
    return (mean + spread * rng.standard_normal(shape)).astype(np.float32).astype(dtype)


def dtype_of(name: str) -> Optional[np.dtype]:
    return {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16}[name]
