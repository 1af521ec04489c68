"""Backward LayerNorm / RMSNorm throughput (bench/kernels.py --bwd): lnormd's CUDA
kernels (lnorm_cuda_norm_bwd through ctypes) beside the peers, in one process, on the
same tensors: torch eager autograd (F.layer_norm / F.rms_norm), torch.compile (its
compiled backward), Liger-Kernel (LigerLayerNormFunction / LigerRMSNormFunction) and
flash-attention's Triton layer_norm (layer_norm_fn / rms_norm_fn). The peers' code is
not vendored: --peers names a folder with liger_kernel/ (the wheel unpacked) and a
folder fa/ holding flash_attn/ops/triton/layer_norm.py and flash_attn/utils/
(torch.py, library.py); a peer that does not load or refuses a shape is recorded as
null with the reason.

Every implementation gets x, dy, gamma (and beta for LayerNorm) of one dtype and the
forward's statistics (lnormd: mean/rstd from its own forward; the peers keep theirs
from their forward, outside the timing) and computes dx, dgamma (and dbeta for
LayerNorm); each allocates dx per call. GB/s = 3 x N x H x element bytes (x and dy
read, dx written) / median time (triton.testing.do_bench), N x H = 2^26 by default.
Each row also checks every dx against torch eager's (max |dx - eager| / max |eager|)
and lnormd's dgamma/dbeta against eager's.

With --previous LIB (the library of an earlier kernel tree), each row also times that
tree's backward on the same tensors, in --prev-rounds rounds alternating with this
tree's (lnormd_prev_build; lnormd_vs_prev = ratio of the medians), and checks that
both give the same dx, dgamma and dbeta bits (prev_same_bits).
"""
import ctypes
import datetime
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.testing

DT = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
OPS = {"ln": 1, "rms": 2}
EPS = 1e-5

# The best peer measured on the H200 on 2026-12-02 (the targets' reference), N x H = 2^26, GB/s,
# printed beside this run's own peers.
ISSUE_PEERS = {("ln", "bfloat16"): {1024: 1219, 4096: 2299, 8192: 1827, 16384: 1826, 65536: 1418},
               ("ln", "float32"): {1024: 3449, 4096: 3425, 8192: 3569, 16384: 2192, 65536: 1729},
               ("rms", "bfloat16"): {1024: 1812, 4096: 2857, 8192: 2802, 16384: 2670, 65536: 1580},
               ("rms", "float32"): {1024: 3710, 4096: 3698, 8192: 3735, 16384: 3009, 65536: 1725}}


def bind_bwd(lib):
    f = lib.lnorm_cuda_norm_bwd
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 9 + \
        [ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    g = lib.lnorm_cuda_norm_bwd_scratch
    g.restype = ctypes.c_int64
    g.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.lnorm_cuda_bwd_tier.restype = ctypes.c_int
    lib.lnorm_cuda_bwd_tier.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p)]


def load_peers(folder):
    """The peers' entry points by name, or the reason each could not load."""
    peers, why = {}, {}
    if folder:
        for sub in ("liger", "fa"):
            p = os.path.join(folder, sub)
            if os.path.isdir(p):
                sys.path.insert(0, p)
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        peers["liger"] = (LigerLayerNormFunction, LigerRMSNormFunction)
    except Exception as e:  # recorded, not fatal: the JSON says which peer ran
        why["liger"] = f"{type(e).__name__}: {e}"
    try:
        from flash_attn.ops.triton.layer_norm import layer_norm_fn, rms_norm_fn
        peers["flash_attn"] = (layer_norm_fn, rms_norm_fn)
    except Exception as e:
        why["flash_attn"] = f"{type(e).__name__}: {e}"
    return peers, why


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def peer_forward(name, op, x, w, b, peers, comp):
    """The peer's forward output (autograd graph kept) for inputs that require grad."""
    if name == "torch_eager":
        return _ln(x, w, b) if op == "ln" else _rms(x, w)
    if name == "torch_compile":
        return comp[op](x, w, b) if op == "ln" else comp[op](x, w)
    if name == "liger":
        ln_f, rms_f = peers["liger"]
        return ln_f.apply(x, w, b, EPS) if op == "ln" else rms_f.apply(x, w, EPS, 0.0, "llama", False)
    if name == "flash_attn":
        ln_f, rms_f = peers["flash_attn"]
        return ln_f(x, w, b, eps=EPS) if op == "ln" else rms_f(x, w, None, eps=EPS)
    raise ValueError(name)


def main_bwd(a, lib):
    bind_bwd(lib)
    prev = None
    if a.previous:
        from lnorm_lib import load_lib  # (bench/, this file's folder)
        prev = load_lib(a.previous)
        bind_bwd(prev)
    peers, peer_why = ({}, {}) if a.no_peers else load_peers(a.peers)
    names = ["torch_eager", "torch_compile"] + [n for n in ("liger", "flash_attn") if n in peers]
    if a.no_peers:
        names = ["torch_eager"]  # the reference for the dx check, timed too
    dev = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    total = 1 << a.elems_log2
    Hs = [int(h) for h in a.hs.split(",")] if a.hs else [1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    comp = {"ln": torch.compile(_ln, dynamic=False), "rms": torch.compile(_rms, dynamic=False)}
    compile_spent = 0.0
    t_start = time.time()
    peer_hs = set(int(h) for h in a.peer_hs.split(",")) if a.peer_hs else None
    stream = torch.cuda.current_stream().cuda_stream
    rows, copy_gbs = [], {}
    os.makedirs(a.out, exist_ok=True)
    stem = f"-{a.name}" if a.name else ""
    jpath = os.path.join(a.out, f"kernels-bwd{stem}.json")

    def write(done):
        out = {"what": "backward throughput, lnormd's kernels beside the peers, one process, same tensors",
               "device": dev, "date": date, "commit": a.commit, "elements": total, "complete": done,
               "gbs_definition": "3 * N * H * element_bytes (x, dy read, dx written) / median time (do_bench); "
                                 "dgamma/dbeta computed by every implementation, not counted",
               "target": "at least the best peer, and >= 0.80 x copy for H <= 16384, >= 0.65 x copy above",
               "copy_gbs": copy_gbs, "peers": names, "peers_not_loaded": peer_why,
               "torch": torch.__version__, "triton": triton.__version__,
               "torch_compile_seconds": compile_spent, "rows": rows}
        if a.tuning:
            out["tuning"] = a.tuning
        if prev is not None and rows:
            r = sorted(row["lnormd_vs_prev"] for row in rows)
            out["previous_build"] = {
                "what": f"lnormd's kernels of commit {a.prev_commit} on the same tensors, {a.prev_rounds} rounds "
                        "alternating with this tree's; ratio = median new / median previous (GB/s)",
                "commit": a.prev_commit,
                "ratio_new_over_prev": {"min": r[0], "median": statistics.median(r), "max": r[-1]},
                "same_bits_every_row": all(row["prev_same_bits"] for row in rows)}
        with open(jpath, "w") as f:
            json.dump(out, f, indent=1)
    torch.manual_seed(0)
    for dtype in [getattr(torch, d) for d in a.dtypes.split(",")]:
        dname = str(dtype).replace("torch.", "")
        esz = torch.tensor([], dtype=dtype).element_size()
        src = torch.randn(total, device="cuda").to(dtype)
        dst = torch.empty_like(src)
        t = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
        copy_gbs[dname] = 2 * total * esz / (t * 1e-3) / 1e9
        del dst
        for op in a.ops.split(","):
            for H in Hs:
                N = total // H
                x = src.view(N, H)
                dy = torch.randn(N, H, device="cuda").to(dtype)
                w = (torch.randn(H, device="cuda") * 0.5 + 1).to(dtype)
                b = (torch.randn(H, device="cuda") * 0.1).to(dtype) if op == "ln" else None
                gbs = lambda ms: 3 * N * H * esz / (ms * 1e-3) / 1e9  # noqa: E731
                res = {"op": op, "dtype": dname, "H": H, "N": N, "copy": copy_gbs[dname]}
                desc = ctypes.c_char_p()
                lib.lnorm_cuda_bwd_tier(DT[dtype], H, ctypes.byref(desc))
                res["lnormd_tier"] = desc.value.decode()
                # lnormd: statistics from its forward, then the backward.
                mean = torch.empty(N, device="cuda", dtype=torch.float32) if op == "ln" else None
                rstd = torch.empty(N, device="cuda", dtype=torch.float32)
                y = torch.empty_like(x)
                rc = lib.lnorm_cuda_norm(OPS[op], DT[dtype], 0, 0, N, H, 0, 0, x.data_ptr(), y.data_ptr(), None, None,
                                         w.data_ptr(), b.data_ptr() if b is not None else None,
                                         mean.data_ptr() if mean is not None else None, rstd.data_ptr(),
                                         EPS, 0, stream, lib.ws)
                if rc != 0:
                    raise RuntimeError(f"lnorm_cuda_norm returned {rc}")
                del y
                nbytes = max(lb.lnorm_cuda_norm_bwd_scratch(OPS[op], DT[dtype], N, H, 1, 1 if op == "ln" else 0)
                             for lb in ([lib] if prev is None else [lib, prev]))
                scratch = torch.empty(max(nbytes, 1), device="cuda", dtype=torch.uint8)
                dg = torch.empty(H, device="cuda", dtype=torch.float32)
                db = torch.empty(H, device="cuda", dtype=torch.float32) if op == "ln" else None

                def lnormd(out=None, lb=lib, dgv=dg, dbv=db):
                    dx = torch.empty_like(x) if out is None else out
                    rc = lb.lnorm_cuda_norm_bwd(OPS[op], DT[dtype], 0, 0, 0, N, H, 0, 0, 0, x.data_ptr(),
                                                dy.data_ptr(), dx.data_ptr(), None, w.data_ptr(),
                                                mean.data_ptr() if mean is not None else None, rstd.data_ptr(),
                                                dgv.data_ptr(), dbv.data_ptr() if dbv is not None else None, EPS, 0,
                                                stream, scratch.data_ptr(), nbytes)
                    if rc != 0:
                        raise RuntimeError(f"lnorm_cuda_norm_bwd returned {rc}")
                    return dx
                dx_l = lnormd()
                torch.cuda.synchronize()
                res["lnormd"] = gbs(triton.testing.do_bench(lnormd, rep=a.rep_ms, return_mode="median"))
                if prev is not None:
                    # The earlier tree's kernels on the same tensors, rounds
                    # alternating with this tree's, so that drift hits both.
                    dg_p, db_p = torch.empty_like(dg), torch.empty_like(db) if db is not None else None
                    fn_p = lambda: lnormd(lb=prev, dgv=dg_p, dbv=db_p)  # noqa: E731
                    dx_p = fn_p()
                    torch.cuda.synchronize()
                    res["prev_same_bits"] = bool(torch.equal(dx_p, dx_l) and torch.equal(dg_p, dg) and
                                                 (db is None or torch.equal(db_p, db)))
                    tn, tp = [], []
                    for _ in range(a.prev_rounds):
                        tn.append(gbs(triton.testing.do_bench(lnormd, rep=a.rep_ms, return_mode="median")))
                        tp.append(gbs(triton.testing.do_bench(fn_p, rep=a.rep_ms, return_mode="median")))
                    res["lnormd_prev_build"] = statistics.median(tp)
                    res["lnormd_vs_prev"] = statistics.median(tn) / statistics.median(tp)
                    res["lnormd_vs_prev_rounds"] = {"new": tn, "prev": tp}
                    del fn_p, dx_p, dg_p, db_p
                # Peers: each keeps its forward's graph; the timed call is the backward alone.
                dx_ref = None
                for name in names:
                    if name != "torch_eager" and (
                            (peer_hs is not None and H not in peer_hs) or time.time() - t_start > a.peer_budget_s):
                        res[name] = None
                        res[name + "_why"] = "not timed at this H" if peer_hs is not None and H not in peer_hs \
                            else "the run's peer time budget was spent"
                        continue
                    try:
                        xr = x.detach().requires_grad_(True)
                        wr = w.detach().requires_grad_(True)
                        br = b.detach().requires_grad_(True) if b is not None else None
                        t0 = time.time()
                        if name == "torch_compile" and compile_spent > a.compile_budget_s:
                            res[name] = None
                            res[name + "_why"] = "compile time budget spent"
                            continue
                        yv = peer_forward(name, op, xr, wr, br, peers, comp)
                        ins = [xr, wr] + ([br] if br is not None else [])
                        grads = torch.autograd.grad(yv, ins, dy, retain_graph=True)
                        torch.cuda.synchronize()
                        if name == "torch_compile":
                            compile_spent += time.time() - t0
                        fn = lambda: torch.autograd.grad(yv, ins, dy, retain_graph=True)  # noqa: E731
                        res[name] = gbs(triton.testing.do_bench(fn, rep=a.rep_ms, return_mode="median"))
                        if name == "torch_eager":
                            dx_ref = grads[0].float()
                            dg_ref = grads[1].float()
                            db_ref = grads[2].float() if len(grads) > 2 else None
                            scale = dx_ref.abs().max().item()
                            res["lnormd_dx_vs_eager"] = (dx_l.float() - dx_ref).abs().max().item() / scale
                            res["lnormd_dgamma_vs_eager"] = ((dg - dg_ref).abs().max() / dg_ref.abs().max()).item()
                            if db_ref is not None:
                                res["lnormd_dbeta_vs_eager"] = ((db - db_ref).abs().max() / db_ref.abs().max()).item()
                        elif dx_ref is not None:
                            res[name + "_dx_vs_eager"] = (grads[0].float() - dx_ref).abs().max().item() / \
                                dx_ref.abs().max().item()
                        del yv, grads, fn
                    except Exception as e:  # a peer that refuses the shape (flash-attention: rows >= 64 KB)
                        res[name] = None
                        res[name + "_why"] = f"{type(e).__name__}: {str(e)[:200]}"
                        if a.verbose:
                            traceback.print_exc()
                    torch.cuda.empty_cache()
                cp = copy_gbs[dname]
                res["lnormd_vs_copy"] = res["lnormd"] / cp
                timed = [res[n] for n in names if res.get(n)]
                if not a.no_peers and len(timed) > 1:
                    res["best_peer"] = max(timed)
                    res["peers_timed"] = [n for n in names if res.get(n)]
                    res["lnormd_vs_best_peer"] = res["lnormd"] / res["best_peer"]
                    target = 0.80 if H <= 16384 else 0.65
                    res["target_copy_fraction"] = target
                    res["meets_target"] = bool(res["lnormd"] >= res["best_peer"] and res["lnormd"] >= target * cp)
                ip = ISSUE_PEERS.get((op, dname), {}).get(H)
                if ip:
                    res["issue_best_peer_2026_12_02"] = ip
                rows.append(res)
                write(False)  # a run cut short keeps the rows it timed
                peer_txt = " ".join(f"{n} {res[n]:6.0f}" if res.get(n) else f"{n} -" for n in names)
                print(f"{op:3s} {dname:8s} H={H:6d} {res['lnormd_tier']:14s} lnormd {res['lnormd']:6.0f} | {peer_txt}"
                      f" | vs copy {res['lnormd_vs_copy']:.2f}"
                      + (f" new/prev {res['lnormd_vs_prev']:.3f}{'' if res['prev_same_bits'] else ' BITS DIFFER'}"
                         if prev is not None else "")
                      + (f" vs peer {res['lnormd_vs_best_peer']:.2f} {'OK' if res['meets_target'] else 'MISS'}"
                         if "best_peer" in res else "")
                      + f" (dx err {res.get('lnormd_dx_vs_eager', float('nan')):.2g},"
                        f" dgamma err {res.get('lnormd_dgamma_vs_eager', float('nan')):.2g})", flush=True)
                del x, dy, w, b, dx_l, scratch, dx_ref
                torch.cuda.empty_cache()
        del src
    write(True)
    print("wrote", jpath)
    return 0
