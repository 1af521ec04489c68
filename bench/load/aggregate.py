#!/usr/bin/env python3
"""Combine several lnorm-bench --json files (rounds of the same sweep, run
one after the other on the same machine) into one result: every round kept,
plus per-point medians and the median/min/max of the lnormd/echo ratios.

usage: aggregate.py --out FILE --name NAME [--note TEXT] [--target-ratio X]
                    [--tag K=V ...] ROUND.json...
"""
import argparse
import json
import statistics


def median_or_none(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def key(run):
    load = ("rate", run["offered_rate"]) if run["mode"] == "open" else ("c", run["concurrency"])
    return (run["target"], run["driver"]) + load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--target-ratio", type=float, default=None,
                    help="the goal for the lnormd/echo throughput ratio")
    ap.add_argument("--tag", action="append", default=[])
    ap.add_argument("rounds", nargs="+")
    a = ap.parse_args()
    rounds = [json.load(open(p)) for p in a.rounds]
    first = rounds[0]
    points = {}
    for rd in rounds:
        for run in rd["runs"]:
            if "error" in run:
                continue
            points.setdefault(key(run), []).append(run)
    summary = []
    for k, runs in points.items():
        summary.append({
            "target": k[0], "driver": k[1], k[2] if k[2] == "c" else "offered_rate": k[3],
            "rounds": len(runs),
            "requests_per_s_median": statistics.median(r["throughput"]["requests_per_s"] for r in runs),
            "gb_per_s_median": statistics.median(r["throughput"]["gb_per_s"] for r in runs),
            "p50_us_median": statistics.median(r["latency_us"]["p50"] for r in runs),
            "p99_us_median": statistics.median(r["latency_us"]["p99"] for r in runs),
            "errors_total": sum(r["errors"] for r in runs),
            "verify_mismatches_total": sum(r["verify"]["mismatches"] for r in runs),
            "server_queue_us_median": statistics.median(r["server"]["queue_us_mean"] for r in runs),
            "server_compute_us_median": statistics.median(r["server"]["compute_us_mean"] for r in runs),
            "batch_requests_median": statistics.median(r["server"]["batch_requests_mean"] for r in runs),
            "loadavg_at_start": [r.get("loadavg_at_start", "") for r in runs],
            "server_cpu_us_per_request_median": median_or_none([r.get("cpu_us_per_request", {}).get("server") for r in runs]),
            "client_cpu_us_per_request_median": median_or_none([r.get("cpu_us_per_request", {}).get("client") for r in runs]),
        })
    ratios = {}
    cpu_ratios = {}
    for rd in rounds:
        for q in rd.get("ratios_vs_echo", []):
            load = ("rate", q["offered_rate"]) if "offered_rate" in q else ("c", q["concurrency"])
            ratios.setdefault((q["driver"],) + load, []).append(q["throughput_ratio"])
            if q.get("server_cpu_per_request_ratio") is not None:
                cpu_ratios.setdefault((q["driver"],) + load, []).append(q["server_cpu_per_request_ratio"])
    ratio_list = []
    for k, vals in sorted(ratios.items()):
        med = statistics.median(vals)
        item = {"driver": k[0], k[1] if k[1] == "c" else "offered_rate": k[2],
                "throughput_ratio_median": med, "min": min(vals), "max": max(vals),
                "per_round": vals,
                "server_cpu_per_request_ratio_median": median_or_none(cpu_ratios.get(k, [])),
                "server_cpu_per_request_ratio_per_round": cpu_ratios.get(k, [])}
        if a.target_ratio is not None:
            item["target"] = a.target_ratio
            item["meets_target"] = med >= a.target_ratio
        ratio_list.append(item)
    out = {
        "name": a.name,
        "note": a.note,
        "device": first["device"],
        "date": first["date"],
        "commit": first["commit"],
        "host": first["host"],
        "tags": dict(t.split("=", 1) for t in a.tag),
        "rounds": len(rounds),
        "commands": [r["command"] for r in rounds],
        "summary": summary,
        "lnormd_over_echo_throughput": ratio_list,
        "raw_rounds": rounds,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for r in ratio_list:
        load = ("c=%s" % r["c"]) if "c" in r else ("rate=%s" % r["offered_rate"])
        print("%s driver=%s %s: lnormd/echo throughput ratio median %.3f (min %.3f, max %.3f, %d rounds)%s"
              % (a.name, r["driver"], load, r["throughput_ratio_median"], r["min"], r["max"],
                 len(r["per_round"]),
                 "" if a.target_ratio is None else
                 (" target %.2f: %s" % (a.target_ratio, "met" if r["meets_target"] else "NOT met"))))


if __name__ == "__main__":
    main()
