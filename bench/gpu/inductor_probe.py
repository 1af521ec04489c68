#!/usr/bin/env python3
"""What torch.compile runs for LayerNorm / RMSNorm at the shapes where it
leads lnormd (bench/kernels.py's rows): for each (op, dtype, H) at
N x H = 2^27 it compiles the same functions as bench/kernels.py, times them
(triton.testing.do_bench median, GB/s as there), and writes the generated
Triton source, the configuration the autotuner kept (num_warps, XBLOCK,
RBLOCK, ...), registers, spills, shared memory and the PTX of each kernel
under OUT/. Read-only study material: it changes nothing in lnormd.

Usage (device): python3 bench/gpu/inductor_probe.py --out DIR [--cases ln:bf16:128,...]
"""
import argparse
import gc
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

DTS = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def autotuners():
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    out = []
    for o in gc.get_objects():
        try:
            if isinstance(o, CachingAutotuner):
                out.append(o)
        except Exception:  # noqa: BLE001 (objects that refuse isinstance)
            pass
    return out


def describe(at):
    d = {"name": getattr(getattr(at, "fn", None), "__name__", "?"),
         "configs_tried": [str(c) for c in getattr(at, "configs", []) or []]}
    ls = getattr(at, "launchers", []) or []
    d["launchers"] = []
    for ln in ls:
        e = {"config": str(getattr(ln, "config", "?")),
             "n_regs": getattr(ln, "n_regs", None),
             "n_spills": getattr(ln, "n_spills", None),
             "shared": getattr(ln, "shared", None)}
        b = getattr(ln, "bin", None)
        asm = getattr(b, "asm", None) if b is not None else None
        if isinstance(asm, dict) and "ptx" in asm:
            e["ptx"] = asm["ptx"]
        d["launchers"].append(e)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="ln:bf16:128,rms:bf16:512,ln:f32:2048,rms:f32:2048,ln:f32:4096,"
                    "rms:f32:4096,ln:f32:8192,rms:f32:8192,rms:f32:16384,rms:f32:32768,"
                    "rms:bf16:8192,rms:bf16:32768,ln:bf16:16384")
    ap.add_argument("--elems-log2", type=int, default=27)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from torch._inductor.utils import run_and_get_code
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    summary = []
    for case in a.cases.split(","):
        op, dn, hs = case.split(":")
        H = int(hs)
        dt = DTS[dn]
        N = (1 << a.elems_log2) // H
        torch.manual_seed(0)
        x = torch.randn(N, H, device="cuda", dtype=dt)
        w = torch.randn(H, device="cuda", dtype=dt)
        b = torch.randn(H, device="cuda", dtype=dt)
        torch._dynamo.reset()
        fn = torch.compile(_ln if op == "ln" else _rms, dynamic=False)
        args = (x, w, b) if op == "ln" else (x, w)
        before = {id(o) for o in autotuners()}
        _, codes = run_and_get_code(fn, *args)
        ms = triton.testing.do_bench(lambda: fn(*args), return_mode="median")
        gbs = 2 * N * H * x.element_size() / (ms * 1e-3) / 1e9
        ats = [describe(o) for o in autotuners() if id(o) not in before]
        tag = f"{op}-{dn}-{H}"
        with open(os.path.join(a.out, tag + ".py"), "w") as f:
            f.write("\n\n# ----\n".join(codes))
        for i, d in enumerate(ats):
            for j, e in enumerate(d["launchers"]):
                p = e.pop("ptx", None)
                if p:
                    with open(os.path.join(a.out, f"{tag}-k{i}-l{j}.ptx"), "w") as f:
                        f.write(p)
        rec = {"case": tag, "gbs": round(gbs, 1), "kernels": ats}
        summary.append(rec)
        print(json.dumps({"case": tag, "gbs": rec["gbs"],
                          "kept": [[e["config"], e["n_regs"], e["n_spills"], e["shared"]]
                                   for d in ats for e in d["launchers"]]}), flush=True)
        del x, w, b
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "triton": triton.__version__, "cases": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
