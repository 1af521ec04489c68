"""lnormd's kernel beside torch.compile's and a plain copy of the same bytes, for Nsight Compute
(scripts/device-ncu.sh with NCU_PEERS=1): one launch of each between cudaProfilerStart and
cudaProfilerStop (ncu --profile-from-start off), after warm-ups (torch.compile's compilation and
autotuning happen outside), so that
ncu's DRAM bytes, duration and occupancy of the three can be read side by side.

Cases: op:dtype:H at N x H = 2^27 (as bench/kernels.py), default bulk settings.
Usage: python3 bench/gpu/ncu_peers.py LIB [op:dtype:H ...]
"""
import ctypes
import sys

import torch
import torch.nn.functional as F

OPS = {"ln": 1, "rms": 2}
DT = {"f32": (1, torch.float32), "f16": (2, torch.float16), "bf16": (3, torch.bfloat16)}


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def main():
    lib = ctypes.CDLL(sys.argv[1])
    f = lib.lnorm_cuda_norm
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 8 + \
        [ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    comp_ln = torch.compile(_ln, dynamic=False)
    comp_rms = torch.compile(_rms, dynamic=False)
    cases = sys.argv[2:] or ["ln:bf16:1024", "ln:f32:4096"]
    for c in cases:
        op, dt, H = c.split(":")
        H = int(H)
        code, tdt = DT[dt]
        N = (1 << 27) // H
        x = torch.randn(N, H, device="cuda").to(tdt)
        y = torch.empty_like(x)
        y2 = torch.empty_like(x)
        w = (torch.randn(H, device="cuda") * 0.5 + 1).to(tdt)
        b = (torch.randn(H, device="cuda") * 0.1).to(tdt) if op == "ln" else None
        stream = torch.cuda.current_stream().cuda_stream

        def lnormd():
            rc = f(OPS[op], code, 0, 0, N, H, 0, 0, x.data_ptr(), y.data_ptr(), None, None,
                   w.data_ptr(), b.data_ptr() if b is not None else None, None, None, 1e-5, 0, stream)
            assert rc == 0, rc

        def compiled():
            return comp_ln(x, w, b) if op == "ln" else comp_rms(x, w)

        def copy():
            y2.copy_(x)
        for fn in (lnormd, compiled, copy):  # warm-ups (compilation, autotuning)
            fn()
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for fn in (lnormd, compiled, copy):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"launched {c}", flush=True)


if __name__ == "__main__":
    main()
