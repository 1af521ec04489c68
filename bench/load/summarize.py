#!/usr/bin/env python3
"""Print markdown tables of the bench/results/load-*.json files (for
docs/bench.md)."""
import json
import os
import sys

RES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")


def load(name):
    p = os.path.join(RES, name)
    return json.load(open(p)) if os.path.exists(p) else None


def pairs(d):
    print("device: %s, %s CPUs; date %s; commit %s" % (
        d["device"], d["raw_rounds"][0].get("cpus_online", "?"), d["date"], d["commit"]))
    la = sorted({la for s in d["summary"] for la in s.get("loadavg_at_start", []) if la},
                key=lambda v: float(v.split()[0]))
    if la:
        print("load average (1/5/15 min) at the start of the points: %s .. %s" % (la[0], la[-1]))
    print()
    print("| driver | load | lnormd req/s | echo req/s | lnormd/echo (median, min..max) | target | lnormd p50 / p99 us | echo p50 / p99 us | server queue / compute us | batch reqs | server CPU us/req lnormd / echo |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summ = {(s["target"], s["driver"], s.get("c", s.get("offered_rate"))): s for s in d["summary"]}
    for q in d["lnormd_over_echo_throughput"]:
        load = q.get("c", q.get("offered_rate"))
        l = summ[("lnormd", q["driver"], load)]
        e = summ[("echo", "raw", load)]
        cpu = "-"
        if l.get("server_cpu_us_per_request_median") and e.get("server_cpu_us_per_request_median"):
            cpu = "%.1f / %.1f" % (l["server_cpu_us_per_request_median"], e["server_cpu_us_per_request_median"])
        print("| %s | c=%s | %.0f | %.0f | %.2f (%.2f..%.2f, %d rounds) | %s | %.0f / %.0f | %.0f / %.0f | %.0f / %.1f | %.1f | %s |" % (
            q["driver"], load, l["requests_per_s_median"], e["requests_per_s_median"],
            q["throughput_ratio_median"], q["min"], q["max"], len(q["per_round"]),
            ">= %.1f: %s" % (q["target"], "met" if q["meets_target"] else "**not met**") if "target" in q else "",
            l["p50_us_median"], l["p99_us_median"], e["p50_us_median"], e["p99_us_median"],
            l["server_queue_us_median"], l["server_compute_us_median"], l["batch_requests_median"], cpu))
    print()


def curve(d):
    print("device: %s, %s CPUs; date %s; commit %s" % (d["device"], d.get("cpus_online", "?"), d["date"], d["commit"]))
    print()
    print("| offered req/s | target | achieved req/s | p50 us | p99 us | p99.9 us | errors | load avg at start |")
    print("|---|---|---|---|---|---|---|---|")
    for r in d["runs"]:
        if "error" in r:
            continue
        print("| %.0f | %s | %.0f | %.0f | %.0f | %.0f | %d %s | %s |" % (
            r["offered_rate"], r["target"], r["throughput"]["requests_per_s"], r["latency_us"]["p50"],
            r["latency_us"]["p99"], r["latency_us"]["p99_9"], r["errors"],
            r["errors_by_kind"] if r["errors"] else "", r.get("loadavg_at_start", "")))
    print()


def main():
    for name, fn in (("load-small-vs-echo.json", pairs), ("load-large-vs-echo.json", pairs),
                     ("load-curve.json", curve)):
        d = load(name)
        if d is None:
            continue
        print("#### %s\n" % name)
        fn(d)


if __name__ == "__main__":
    sys.exit(main())
