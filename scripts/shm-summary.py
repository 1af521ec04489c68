#!/usr/bin/env python3
"""Summarise a scripts/device-shm.sh run (shm-runs.json: one JSON a line, from
lnorm-bench and lnorm-ipc-bench) into the results file kept under
bench/results/ (shm-h200.json): a row per measured point, the raw runs
after it.

    scripts/shm-summary.py OUT/shm-runs.json > bench/results/shm-h200.json
"""
import json
import sys


def rows(d):
    if d.get("bench") == "cuda-ipc":
        keep = ("rows", "hidden", "dtype", "us_per_request", "server_compute_us", "server_queue_us", "gbps_x_plus_y",
                "device_copy_gbps", "kernel_in_process_gbps", "ratio_to_copy", "concurrency",
                "pipelined_us_per_request", "pipelined_server_compute_us", "pipelined_gbps_x_plus_y",
                "pipelined_ratio_to_copy", "checks_run", "checks_failed")
        yield dict({"mode": "cuda-ipc"}, **{k: d[k] for k in keep if k in d})
        return
    tags = d.get("tags", {})
    mode = tags.get("mode", "") if isinstance(tags, dict) else ",".join(tags).replace("mode=", "")
    for r in d.get("runs", []):
        t, lat = r.get("throughput", {}), r.get("latency_us", {})
        v = r.get("verify", {})
        yield {"mode": mode, "driver": r.get("driver"), "procs": r.get("procs"),
               "concurrency": r.get("concurrency"), "req_per_s": t.get("requests_per_s"),
               "rows_per_s": t.get("rows_per_s"), "gb_per_s": t.get("gb_per_s"), "p50_us": lat.get("p50"),
               "p99_us": lat.get("p99"), "batch_rows_mean": r.get("server", {}).get("batch_rows_mean"),
               "errors": r.get("errors"), "verified": v.get("checked"), "mismatches": v.get("mismatches")}


def main():
    runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    first = runs[0] if runs else {}
    out = {
        "benchmark": "scripts/device-shm.sh",
        "device": next((r["device"] for r in runs if r.get("bench") == "cuda-ipc"), "NVIDIA H200") +
        " (16-core host)",
        "date": (first.get("date") or "")[:10],
        "commit": first.get("commit", "unknown"),
        "note": "large: f32 LayerNorm rows x 4096, GB/s of x + y; ring/socket: 1 x 4096 bf16 from 16 client "
                "processes, requests in flight in all as concurrency; cuda-ipc: bf16 RMSNorm on GPU memory, one "
                "request at a time and (pipelined_*) concurrency in flight, beside a device-to-device copy and the same kernel in the client process",
        "summary": [row for d in runs for row in rows(d)],
        "runs": runs,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
