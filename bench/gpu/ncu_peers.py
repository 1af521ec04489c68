"""lnormd's kernel beside torch.compile's on the same tensors, for Nsight Compute
(scripts/device-ncu.sh with NCU_PEERS=1): one launch of each between cudaProfilerStart and
cudaProfilerStop (ncu --profile-from-start off), after warm-ups (torch.compile's compilation and
autotuning happen outside), so that ncu's DRAM bytes, duration, instructions and occupancy of
the two can be read side by side. (A device-to-device copy is a cudaMemcpy, not a kernel: ncu
does not profile it; bench/kernels.py times it.)

Cases: op:dtype:H at N x H = 2^27 (as bench/kernels.py), default bulk settings.
LNORM_TUNE="name=value,..." (lnorm_cuda_set_tuning settings, e.g. fast_reread=2,fast_aligned=2):
lnormd is launched a second time with those settings, between its default launch and
torch.compile's (then "defaults" 0 puts them back).
Usage: [LNORM_TUNE=...] python3 bench/gpu/ncu_peers.py LIB [op:dtype:H ...]
"""
import os
import sys

import torch
import torch.nn.functional as F

from ncu_kernels import OPS, case_tensors, load_norm


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def main():
    lib, f = load_norm(sys.argv[1])
    tune = [(kv.split("=")[0], int(kv.split("=")[1])) for kv in os.environ.get("LNORM_TUNE", "").split(",") if kv]
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    comp_ln = torch.compile(_ln, dynamic=False)
    comp_rms = torch.compile(_rms, dynamic=False)
    cases = sys.argv[2:] or ["ln:bf16:1024", "ln:f32:4096"]
    for c in cases:
        op, code, N, H, x, y, w, b = case_tensors(c)
        stream = torch.cuda.current_stream().cuda_stream

        def lnormd():
            rc = f(OPS[op], code, 0, 0, N, H, 0, 0, x.data_ptr(), y.data_ptr(), None, None,
                   w.data_ptr(), b.data_ptr() if b is not None else None, None, None, 1e-5, 0, stream, lib.ws)
            assert rc == 0, rc

        def lnormd_tuned():
            for k, v in tune:
                if lib.lnorm_cuda_set_tuning(k.encode(), v) != 0:
                    raise SystemExit(f"lnorm_cuda_set_tuning({k}, {v}) refused")
            lnormd()
            lib.lnorm_cuda_set_tuning(b"defaults", 0)

        def compiled():
            return comp_ln(x, w, b) if op == "ln" else comp_rms(x, w)
        fns = (lnormd, lnormd_tuned, compiled) if tune else (lnormd, compiled)
        for fn in fns:  # warm-ups (compilation, autotuning)
            fn()
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"launched {c}", flush=True)


if __name__ == "__main__":
    main()
