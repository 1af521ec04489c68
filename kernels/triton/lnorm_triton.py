"""Seed-style Triton LayerNorm / RMSNorm forward, written to lnormd's kernel rules.

One program per row. x is loaded with a mask and cast to fp32 at once; all
statistics are fp32; masked tails contribute 0 and the mean divides by H.
LayerNorm's variance is centred: two passes over the row held in registers
when the row fits one block, otherwise a streamed loop that merges per-block
(count, mean, M2) with Chan's formula (Welford over blocks) and a second loop
that writes y. rstd = 1 / sqrt(var + eps). RMSNorm has no mean at all.
gamma/beta are 1-D, indexed by column; the row stride is an argument; mean
and rstd go to separate fp32 buffers; the store uses the same mask.
"""
import torch
import triton
import triton.language as tl

# Largest row held in one block (elements); longer rows take the streamed loop.
MAX_BLOCK = 16384


@triton.jit
def _norm_fwd(X, Y, W, B, Mean, Rstd, stride_x, stride_y, N, eps,
              IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
              HAS_STATS: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    Y += row * stride_y
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        if IS_RMS:
            mean = 0.0
            xc = x
        else:
            mean = tl.sum(x, axis=0) / N
            xc = tl.where(mask, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        y = xc * rstd
        if HAS_W:
            y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Pass 1: statistics, block by block (Chan merge of count/mean/M2).
        n = 0.0
        m = 0.0
        m2 = 0.0
        for off in range(0, N, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
            if IS_RMS:
                m2 += tl.sum(x * x, axis=0)
            else:
                cnt = tl.sum(mask.to(tl.float32), axis=0)
                bm = tl.sum(x, axis=0) / cnt
                d = tl.where(mask, x - bm, 0.0)
                bm2 = tl.sum(d * d, axis=0)
                tot = n + cnt
                delta = bm - m
                m = m + delta * (cnt / tot)
                m2 = m2 + bm2 + delta * delta * (n * cnt / tot)
                n = tot
        if IS_RMS:
            mean = 0.0
        else:
            mean = m
        var = m2 / N
        rstd = 1.0 / tl.sqrt(var + eps)
        # Pass 2: normalize and store.
        for off in range(0, N, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean) * rstd
            if HAS_W:
                y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    if HAS_STATS:
        if not IS_RMS:
            tl.store(Mean + row, mean)
        tl.store(Rstd + row, rstd)


def norm_fwd(x, weight=None, bias=None, eps=1e-5, rms=False, out=None, stats=False, max_block=MAX_BLOCK):
    """LayerNorm (rms=False) or RMSNorm of the last dimension of a 2-D x
    (rows may be strided). Returns y, or (y, mean, rstd) with stats=True
    (mean is None for RMSNorm)."""
    if eps <= 0:
        raise ValueError("eps must be > 0")
    assert x.dim() == 2 and x.stride(1) == 1, "x must be 2-D with unit column stride"
    M, N = x.shape
    y = out if out is not None else torch.empty((M, N), dtype=x.dtype, device=x.device)
    assert y.stride(1) == 1
    mean = torch.empty(M, dtype=torch.float32, device=x.device) if (stats and not rms) else None
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if stats else None
    block = triton.next_power_of_2(N)
    single = block <= max_block
    if not single:
        block = max_block
    num_warps = min(max(block // 256, 1), 16)
    dummy = x
    _norm_fwd[(M,)](x, y, weight if weight is not None else dummy, bias if bias is not None else dummy,
                    mean if mean is not None else dummy, rstd if rstd is not None else dummy,
                    x.stride(0), y.stride(0), N, eps,
                    IS_RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, HAS_STATS=stats,
                    BLOCK=block, SINGLE=single, num_warps=num_warps)
    if stats:
        return y, mean, rstd
    return y
