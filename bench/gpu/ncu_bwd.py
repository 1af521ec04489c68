"""Launch lnormd's backward kernels once each, for Nsight Compute (NCU_BWD=1 scripts/device-ncu.sh).

Cases: op, dtype, H at N x H = 2^26 (as bench/kernels.py --bwd), mean/rstd from lnormd's
forward, dgamma (and dbeta for LayerNorm) asked for; each case launched twice (a warm-up,
then the same launch again).
Usage: python3 bench/gpu/ncu_bwd.py LIB [op:dtype:H ...]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernels_bwd import bind_bwd  # noqa: E402
from ncu_kernels import OPS, DT, load_norm  # noqa: E402


def main():
    lib, fwd = load_norm(sys.argv[1])
    bind_bwd(lib)
    stream = torch.cuda.current_stream().cuda_stream
    cases = sys.argv[2:] or ["ln:bf16:4096", "ln:bf16:8192", "ln:bf16:65536", "ln:f32:8192"]
    for c in cases:
        op, dt, H = c.split(":")
        H = int(H)
        code, tdt = DT[dt]
        N = (1 << 26) // H
        x = torch.randn(N, H, device="cuda").to(tdt)
        dy = torch.randn(N, H, device="cuda").to(tdt)
        dx = torch.empty_like(x)
        y = torch.empty_like(x)
        w = (torch.randn(H, device="cuda") * 0.5 + 1).to(tdt)
        b = (torch.randn(H, device="cuda") * 0.1).to(tdt) if op == "ln" else None
        mean = torch.empty(N, device="cuda") if op == "ln" else None
        rstd = torch.empty(N, device="cuda")
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        rc = fwd(OPS[op], code, 0, 0, N, H, 0, 0, x.data_ptr(), y.data_ptr(), None, None, ptr(w), ptr(b),
                 ptr(mean), rstd.data_ptr(), 1e-5, 0, stream, lib.ws)
        assert rc == 0, rc
        nbytes = lib.lnorm_cuda_norm_bwd_scratch(OPS[op], code, N, H, 1, 1 if op == "ln" else 0)
        scratch = torch.empty(max(nbytes, 1), device="cuda", dtype=torch.uint8)
        dg = torch.empty(H, device="cuda")
        db = torch.empty(H, device="cuda") if op == "ln" else None
        for _ in range(2):
            rc = lib.lnorm_cuda_norm_bwd(OPS[op], code, 0, 0, 0, N, H, 0, 0, 0, x.data_ptr(), dy.data_ptr(),
                                         dx.data_ptr(), None, w.data_ptr(), ptr(mean), rstd.data_ptr(),
                                         dg.data_ptr(), ptr(db), 1e-5, 0, stream, scratch.data_ptr(), nbytes)
            assert rc == 0, rc
        torch.cuda.synchronize()
        print(f"launched {c}", flush=True)


if __name__ == "__main__":
    main()
