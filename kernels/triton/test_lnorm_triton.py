"""Correctness of the Triton seed kernel (kernels/triton/lnorm_triton.py) on a GPU.

LayerNorm against torch.nn.functional.layer_norm and a float64 reference,
RMSNorm against a float64 reference, in fp16 and fp32, for hidden sizes that
take the one-block path and the streamed (Welford) path, strided rows, with
and without gamma/beta, with mean/rstd checked. Outputs are poisoned (NaN)
first. Exits 1 on any failure, and when no GPU is present (never a pass by
skipping). Run: python3 kernels/triton/test_lnorm_triton.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lnorm_triton import norm_fwd  # noqa: E402


def ref64(x, w, b, eps, rms):
    h = x.double()
    if rms:
        mean = torch.zeros(h.shape[0], dtype=torch.float64, device=h.device)
        var = (h * h).mean(dim=1)
        hc = h
    else:
        mean = h.mean(dim=1)
        hc = h - mean[:, None]
        var = (hc * hc).mean(dim=1)
    rstd = 1.0 / torch.sqrt(var + eps)
    y = hc * rstd[:, None]
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y, mean, rstd


def main():
    if not torch.cuda.is_available():
        print("FAIL: no GPU (this test needs one)")
        return 1
    torch.manual_seed(1234)
    fails = 0
    cases = 0
    # (H, max_block): the streamed path is forced with a small max_block too.
    sizes = [(1, None), (3, None), (64, None), (65, None), (1000, None), (4096, None), (4097, None),
             (16384, None), (20000, None), (65536, None), (5000, 1024), (1000, 256)]
    for dtype in (torch.float16, torch.float32):
        tol_y = 2e-3 if dtype == torch.float16 else 2e-5
        for rms in (False, True):
            for (H, mb) in sizes:
                for affine in (False, True):
                    for pad in (0, 3):
                        cases += 1
                        M = 37 if H <= 20000 else 5
                        base = torch.randn(M, H + pad, device="cuda", dtype=torch.float32) * 2.0 + 0.5
                        x = base.to(dtype)[:, :H]  # strided rows when pad > 0
                        w = (torch.randn(H, device="cuda") * 0.5 + 1.0).to(dtype) if affine else None
                        b = (torch.randn(H, device="cuda") * 0.1).to(dtype) if (affine and not rms) else None
                        y = torch.full((M, H), float("nan"), device="cuda", dtype=dtype)
                        kw = {} if mb is None else {"max_block": mb}
                        y, mean, rstd = norm_fwd(x, w, b, eps=1e-5, rms=rms, out=y, stats=True, **kw)
                        yr, mr, rr = ref64(x, w, b, 1e-5, rms)
                        label = f"{dtype} {'rms' if rms else 'ln'} H={H} mb={mb} affine={affine} pad={pad}"
                        err = ((y.double() - yr).abs() / (yr.abs() + 1.0)).max().item()
                        ok = torch.isfinite(y).all().item() and err <= tol_y
                        ok = ok and ((rstd.double() - rr).abs() / rr).max().item() <= 1e-5
                        if not rms:
                            ok = ok and ((mean.double() - mr).abs() / (mr.abs() + 1.0 / rr)).max().item() <= 1e-5
                            tl_ = torch.nn.functional.layer_norm(x, (H,), w, b, 1e-5)
                            d = ((y.float() - tl_.float()).abs() / (tl_.float().abs() + 1.0)).max().item()
                            ok = ok and d <= tol_y
                        if not ok:
                            fails += 1
                            print(f"FAIL {label}: max rel err vs float64 {err:.3g}")
    try:
        norm_fwd(torch.ones(2, 8, device="cuda"), eps=0.0)
        print("FAIL eps=0 accepted")
        fails += 1
    except ValueError:
        pass
    cases += 1
    print(f"{'PASS' if not fails else 'FAIL'}: triton seed kernel, {cases} cases, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
