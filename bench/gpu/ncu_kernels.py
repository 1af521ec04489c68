"""Launch a few lnormd kernels once each, for Nsight Compute (scripts/device-ncu.sh).

Cases: op, dtype, H at N x H = 2^27 (as bench/kernels.py), each with the bulk-copy kernels
off and forced (lnorm_cuda_set_tuning "bulk" 0 / 2), after one warm-up launch.
Usage: python3 bench/gpu/ncu_kernels.py LIB [op:dtype:H ...]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lnorm_lib import load_lib  # noqa: E402

OPS = {"ln": 1, "rms": 2}
DT = {"f32": (1, torch.float32), "f16": (2, torch.float16), "bf16": (3, torch.bfloat16)}


def load_norm(path):
    """The library at path (bench/lnorm_lib.py) and its lnorm_cuda_norm."""
    lib = load_lib(path)
    return lib, lib.lnorm_cuda_norm


def case_tensors(c):
    """Case "op:dtype:H" at N x H = 2^27: (op, dtype code, N, H, x, y, gamma, beta or None)."""
    op, dt, H = c.split(":")
    H = int(H)
    code, tdt = DT[dt]
    N = (1 << 27) // H
    x = torch.randn(N, H, device="cuda").to(tdt)
    y = torch.empty_like(x)
    w = (torch.randn(H, device="cuda") * 0.5 + 1).to(tdt)
    b = (torch.randn(H, device="cuda") * 0.1).to(tdt) if op == "ln" else None
    return op, code, N, H, x, y, w, b


def main():
    lib, f = load_norm(sys.argv[1])
    cases = sys.argv[2:] or ["ln:bf16:4096", "rms:f32:1024", "ln:bf16:16384", "ln:bf16:65536"]
    for c in cases:
        op, code, N, H, x, y, w, b = case_tensors(c)
        for bulk in (0, 2):
            lib.lnorm_cuda_set_tuning(b"bulk", bulk)
            for _ in range(2):  # warm-up, then the profiled launch (ncu --launch-skip)
                rc = f(OPS[op], code, 0, 0, N, H, 0, 0, x.data_ptr(), y.data_ptr(), None, None,
                       w.data_ptr(), b.data_ptr() if b is not None else None, None, None, 1e-5, 0,
                       torch.cuda.current_stream().cuda_stream, lib.ws)
                assert rc == 0, rc
            torch.cuda.synchronize()
            print(f"launched {c} bulk={bulk}", flush=True)
    lib.lnorm_cuda_set_tuning(b"bulk", 1)


if __name__ == "__main__":
    main()
