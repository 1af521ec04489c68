"""Forward LayerNorm / RMSNorm throughput on one GPU, side by side on the same tensors.

Implementations: lnormd's CUDA kernels (liblnorm_cuda_bench.so through ctypes,
torch tensors' data_ptr()), torch eager, torch.compile, and the Triton seed
kernel (kernels/triton). op x dtype (bf16, f32) x H in 128 .. 262144 with
N x H = 2^27 elements; gamma (and beta for LayerNorm) in x's dtype; no
mean/rstd outputs for anyone. The device-to-device copy bandwidth of the
same tensors is measured in the same run as the ceiling.
GB/s = 2 x N x H x element bytes / median time (triton.testing.do_bench).
Outputs (--y call, the default): every implementation, lnormd and the copy
included, writes a new tensor each call from torch's caching allocator, as
torch eager and torch.compile do; lnormd into one preallocated y is timed
as well (lnormd_fixed_y, and the copy into a preallocated dst,
copy_fixed_gbs). Rows where lnormd and a peer are within 2% of each other
time them again in alternating rounds (--rounds, --close) and compare
medians (lnormd_rounds, <peer>_rounds in the JSON).

With --previous LIB (the library of an earlier kernel tree), each row also
times that library's lnormd on the same tensors, alternating with this one's
in --prev-rounds rounds (lnormd_prev_build; lnormd_vs_prev = ratio of the
medians; previous_build in the JSON sums them up).

Writes kernels[-NAME].json (device, date, commit, every figure) and
kernels[-NAME].png into --out (--name NAME, e.g. h200), and prints a table.
Usage: python3 bench/kernels.py --lib build-sm90/kernels/cuda/liblnorm_cuda_bench.so --out DIR
With --bwd, the backward pass beside its peers instead (bench/kernels_bwd.py).
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F
import triton
import triton.testing

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels", "triton"))
from lnorm_triton import norm_fwd as triton_norm  # noqa: E402
from lnorm_lib import load_lib  # noqa: E402  (bench/, this file's folder)

DT = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
OPS = {"ln": 1, "rms": 2}


def lnormd_fn(lib, op, x, w, b, y):
    """A call of lnormd's kernel through lib writing y; y None: into a new
    tensor each call, from torch's caching allocator, the way torch's own
    functions (eager, torch.compile) allocate their outputs."""
    N, H = x.shape
    stream = torch.cuda.current_stream().cuda_stream
    args = [OPS[op], DT[x.dtype], 0, 0, N, H, 0, 0, x.data_ptr(), 0, None, None,
            w.data_ptr(), b.data_ptr() if b is not None else None, None, None, 1e-5, 0, stream, lib.ws]

    def call(out):
        args[9] = out.data_ptr()
        rc = lib.lnorm_cuda_norm(*args)
        if rc != 0:
            raise RuntimeError(f"lnorm_cuda_norm returned {rc}")
        return out
    if y is not None:
        return lambda: call(y)
    return lambda: call(torch.empty_like(x))


def eager(op, x, w, b):
    H = x.shape[1]
    if op == "ln":
        return lambda: F.layer_norm(x, (H,), w, b, 1e-5)
    return lambda: F.rms_norm(x, (H,), w, 1e-5)


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--name", default="", help="file name suffix: kernels-NAME.json (e.g. the machine, h200)")
    ap.add_argument("--elems-log2", type=int, default=None, help="N x H = 2^this (default 27; --bwd 26)")
    ap.add_argument("--bwd", action="store_true",
                    help="the backward pass instead (bench/kernels_bwd.py): lnormd beside torch eager, "
                         "torch.compile, Liger-Kernel and flash-attention's Triton layer_norm; kernels-bwd[-NAME].json")
    ap.add_argument("--peers", default=None,
                    help="--bwd: folder with the peers' code (liger/liger_kernel, fa/flash_attn), not vendored")
    ap.add_argument("--verbose", action="store_true", help="--bwd: print the peers' failures in full")
    ap.add_argument("--peer-hs", default=None, help="--bwd: time the peers at these H only (comma list)")
    ap.add_argument("--peer-budget-s", type=float, default=1e9,
                    help="--bwd: stop timing peers other than torch eager after this many seconds")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="--bwd: do_bench's rep (ms)")
    ap.add_argument("--compile-budget-s", type=float, default=150.0,
                    help="stop timing torch.compile once its compiles took this long (recorded as skipped)")
    ap.add_argument("--commit", default=os.environ.get("LNORM_COMMIT", "unknown"))
    ap.add_argument("--hs", default=None, help="comma list of hidden sizes (default 128 .. 262144, powers of 2)")
    ap.add_argument("--ops", default="ln,rms")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--y", choices=("call", "fixed"), default="call",
                    help="where outputs go while timed: call (default): a new tensor each call from torch's "
                         "caching allocator for every implementation, as torch eager and torch.compile allocate "
                         "theirs (copy: src.clone()); fixed: lnormd and the Triton seed write one "
                         "preallocated y (copy: dst.copy_(src)). "
                         "With call, lnormd into the preallocated y is also timed (lnormd_fixed_y, copy_fixed_gbs)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rows where lnormd and the best peer are within --close: time both this many "
                         "times in alternating rounds and compare medians (1: one timing each)")
    ap.add_argument("--close", type=float, default=0.02)
    ap.add_argument("--no-peers", action="store_true",
                    help="time lnormd only (no peers, no target verdicts)")
    ap.add_argument("--previous", default=None,
                    help="library of an earlier kernel tree, timed beside this one in alternating rounds")
    ap.add_argument("--prev-commit", default="unknown", help="the commit --previous was built from")
    ap.add_argument("--prev-rounds", type=int, default=3)
    ap.add_argument("--tuning", default="",
                    help="NAME=V[,NAME=V]: lnorm_cuda_set_tuning on this tree's library before timing "
                         "(e.g. bwd_wide=16384 beside --previous, a copy of the same library)")
    a = ap.parse_args()
    lib = load_lib(a.lib)
    for kv in filter(None, a.tuning.split(",")):
        k, _, v = kv.partition("=")
        if not k or not v.lstrip("-").isdigit():
            raise SystemExit(f"--tuning {kv}: want NAME=INTEGER")
        if lib.lnorm_cuda_set_tuning(k.encode(), int(v)) != 0:
            raise SystemExit(f"--tuning {kv}: refused")
    if a.elems_log2 is None:
        a.elems_log2 = 26 if a.bwd else 27
    if a.bwd:
        from kernels_bwd import main_bwd  # (bench/, this file's folder)
        return main_bwd(a, lib)
    prev = load_lib(a.previous) if a.previous else None
    dev = torch.cuda.get_device_name(0)
    stem = f"-{a.name}" if a.name else ""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    total = 1 << a.elems_log2
    Hs = [int(h) for h in a.hs.split(",")] if a.hs else [1 << k for k in range(7, 19)]
    # One compiled graph per shape: lift dynamo's recompile limit (8 by
    # default, after which torch.compile silently falls back to eager).
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    comp_ln = torch.compile(_ln, dynamic=False)
    comp_rms = torch.compile(_rms, dynamic=False)
    compile_spent = 0.0

    call_y = a.y == "call"

    def time_peers(res, gbs, op, x, w, b, y):
        """torch eager, the Triton seed kernel and torch.compile (until its compile budget is
        spent); returns the timed functions by name."""
        nonlocal compile_spent
        fn_e = eager(op, x, w, b)
        res["torch_eager"] = gbs(triton.testing.do_bench(fn_e, return_mode="median"))
        ty = None if call_y else y  # None: the seed allocates its output per call
        if op == "ln":
            fn_t = lambda: triton_norm(x, w, b, 1e-5, rms=False, out=ty)  # noqa: E731
        else:
            fn_t = lambda: triton_norm(x, w, None, 1e-5, rms=True, out=ty)  # noqa: E731
        res["triton_seed"] = gbs(triton.testing.do_bench(fn_t, return_mode="median"))
        if compile_spent < a.compile_budget_s:
            t0 = time.time()
            fn_c = (lambda: comp_ln(x, w, b)) if op == "ln" else (lambda: comp_rms(x, w))
            fn_c()
            torch.cuda.synchronize()
            compile_spent += time.time() - t0
            res["torch_compile"] = gbs(triton.testing.do_bench(fn_c, return_mode="median"))
        else:
            fn_c = None
            res["torch_compile"] = None  # skipped: compile time budget spent
        res["best_peer"] = max(res[k] for k in ("torch_eager", "torch_compile", "triton_seed") if res[k])
        return {"torch_eager": fn_e, "triton_seed": fn_t, "torch_compile": fn_c}

    def close_call(res, gbs, fn_l, fns):
        """Where lnormd and a peer are within --close of each other, time them again in
        alternating rounds (--rounds in all, the first timings included) and keep each one's
        median, so that a verdict does not rest on one timing's drift (about 1% run to run).
        Every peer within --close takes part, so best_peer never compares a median with a
        single timing of another peer that could overtake it."""
        close = [k for k in fns if res[k] and abs(res["lnormd"] / res[k] - 1) <= a.close]
        if a.rounds <= 1 or not close:
            return
        t = {k: [res[k]] for k in ["lnormd"] + close}
        for _ in range(a.rounds - 1):
            t["lnormd"].append(gbs(triton.testing.do_bench(fn_l, return_mode="median")))
            for k in close:
                t[k].append(gbs(triton.testing.do_bench(fns[k], return_mode="median")))
        for k, v in t.items():
            res[k + "_rounds"] = v
            res[k] = statistics.median(v)
        res["best_peer"] = max(res[k] for k in fns if res[k])
    rows = []
    copy_gbs = {}
    copy_fixed_gbs = {}
    torch.manual_seed(0)
    for dtype in [getattr(torch, d) for d in a.dtypes.split(",")]:
        esz = torch.tensor([], dtype=dtype).element_size()
        src = torch.randn(total, device="cuda").to(dtype)
        dst = torch.empty_like(src)
        dname = str(dtype).replace("torch.", "")
        t = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
        copy_fixed_gbs[dname] = 2 * total * esz / (t * 1e-3) / 1e9
        del dst
        if call_y:
            t = triton.testing.do_bench(lambda: src.clone(), return_mode="median")
            copy_gbs[dname] = 2 * total * esz / (t * 1e-3) / 1e9
        else:
            copy_gbs[dname] = copy_fixed_gbs[dname]
        for op in a.ops.split(","):
            for H in Hs:
                N = total // H
                x = src.view(N, H)
                w = (torch.randn(H, device="cuda") * 0.5 + 1).to(dtype)
                b = (torch.randn(H, device="cuda") * 0.1).to(dtype) if op == "ln" else None
                y = torch.full_like(x, float("nan"))
                gbs = lambda ms: 2 * N * H * esz / (ms * 1e-3) / 1e9  # noqa: E731
                res = {"op": op, "dtype": str(dtype).replace("torch.", ""), "H": H, "N": N}
                desc = ctypes.c_char_p()
                lib.lnorm_cuda_tier(DT[dtype], H, ctypes.byref(desc))
                res["lnormd_tier"] = desc.value.decode()
                # Correctness sanity of every implementation against eager.
                fn_l = lnormd_fn(lib, op, x, w, b, y)
                nb = lib.lnorm_cuda_stat(b"bulk_launches")
                fn_l()
                torch.cuda.synchronize()
                res["lnormd_uses_bulk"] = bool(lib.lnorm_cuda_stat(b"bulk_launches") > nb)
                ref = eager(op, x, w, b)()
                res["lnormd_maxdiff_vs_eager"] = (y.float() - ref.float()).abs().max().item()
                del ref
                # Where y lies matters by 0.5-2%: --y call gives every implementation its
                # output the way torch's functions get theirs.
                fn_time = lnormd_fn(lib, op, x, w, b, None) if call_y else fn_l
                res["lnormd"] = gbs(triton.testing.do_bench(fn_time, return_mode="median"))
                if call_y:
                    res["lnormd_fixed_y"] = gbs(triton.testing.do_bench(fn_l, return_mode="median"))
                if prev is not None:
                    # The earlier tree's kernels on the same tensors, rounds
                    # alternating with this tree's, so that drift hits both.
                    fn_p = lnormd_fn(prev, op, x, w, b, None if call_y else y)
                    tn, tp = [], []
                    for _ in range(a.prev_rounds):
                        tn.append(gbs(triton.testing.do_bench(fn_time, return_mode="median")))
                        tp.append(gbs(triton.testing.do_bench(fn_p, return_mode="median")))
                    res["lnormd_prev_build"] = statistics.median(tp)
                    res["lnormd_vs_prev"] = statistics.median(tn) / statistics.median(tp)
                    res["lnormd_vs_prev_rounds"] = {"new": tn, "prev": tp}
                    del fn_p
                cp = copy_gbs[res["dtype"]]
                res["copy"] = cp
                if call_y:
                    res["copy_fixed"] = copy_fixed_gbs[res["dtype"]]
                mid = verdict = ""
                if not a.no_peers:
                    close_call(res, gbs, fn_time, time_peers(res, gbs, op, x, w, b, y))
                    res["lnormd_vs_best_peer"] = res["lnormd"] / res["best_peer"]
                    target = 0.95 if H <= 16384 else 0.85
                    res["meets_target"] = bool(res["lnormd"] >= res["best_peer"] and res["lnormd"] >= target * cp)
                    tc = res["torch_compile"]
                    mid = (f"eager {res['torch_eager']:6.0f} compile {tc if tc is None else round(tc):>6} "
                           f"triton {res['triton_seed']:6.0f} | vs peer {res['lnormd_vs_best_peer']:.2f} ")
                    verdict = "OK " if res["meets_target"] else "MISS "
                res["lnormd_vs_copy"] = res["lnormd"] / cp
                rows.append(res)
                print(f"{op:3s} {res['dtype']:8s} H={H:6d} {res['lnormd_tier']:16s}{'B' if res.get('lnormd_uses_bulk') else ' '} lnormd {res['lnormd']:6.0f} "
                      + mid + f"vs copy {res['lnormd_vs_copy']:.2f} " + verdict
                      + f"(maxdiff {res['lnormd_maxdiff_vs_eager']:.3g})"
                      + (f" fixy {res['lnormd_fixed_y']:.0f}" if call_y else "")
                      + (f" [medians of {a.rounds} rounds]" if "lnormd_rounds" in res else "")
                      + (f" new/prev {res['lnormd_vs_prev']:.3f}" if prev is not None else ""), flush=True)
                del fn_l, fn_time  # fn_l's closure holds y
                del y
        del src
    out = {"device": dev, "date": date, "commit": a.commit, "elements": total,
           "gbs_definition": "2 * N * H * element_bytes / median time (do_bench)",
           "copy_gbs": copy_gbs, "copy_fixed_gbs": copy_fixed_gbs, "y": a.y, "torch": torch.__version__, "triton": triton.__version__,
           "torch_compile_seconds": compile_spent, "rows": rows}
    if a.tuning:
        out["tuning"] = a.tuning
    if prev is not None:
        r = sorted(row["lnormd_vs_prev"] for row in rows)
        out["previous_build"] = {
            "what": f"lnormd's kernels of commit {a.prev_commit} on the same tensors, {a.prev_rounds} rounds "
                    "alternating with this build's, medians",
            "commit": a.prev_commit,
            "ratio_new_over_prev": {"min": r[0], "median": statistics.median(r), "max": r[-1]}}
    os.makedirs(a.out, exist_ok=True)
    jpath = os.path.join(a.out, f"kernels{stem}.json")
    with open(jpath, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", jpath)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex=True)
        for ax, (op, dt) in zip(axes.flat, [("ln", "bfloat16"), ("ln", "float32"), ("rms", "bfloat16"), ("rms", "float32")]):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dt]
            for k in ("lnormd", "torch_eager", "torch_compile", "triton_seed"):
                pts = [(r["H"], r[k]) for r in sel if r.get(k)]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k)
            if dt in copy_gbs:  # (a dtype the run did not time has no copy figure)
                ax.axhline(copy_gbs[dt], color="k", ls="--", label="copy")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op} {dt} ({dev}, {date})")
            ax.set_xlabel("H")
            ax.set_ylabel("GB/s")
            ax.legend(fontsize=8)
        fig.tight_layout()
        ppath = os.path.join(a.out, f"kernels{stem}.png")
        fig.savefig(ppath, dpi=90)
        print("wrote", ppath)
    except Exception as e:  # the JSON is the record; the plot is a convenience
        print("plot failed:", e)
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("FAIL: no GPU")
        sys.exit(1)
    sys.exit(main())
