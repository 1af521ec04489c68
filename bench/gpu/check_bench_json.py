#!/usr/bin/env python3
"""bench.backend_mock: the JSON of lnorm-backend-bench parses and says what it should."""
import json
import sys

d = json.load(open(sys.argv[1]))
want = int(sys.argv[2]) if len(sys.argv) > 2 else 4
m = d["modes"]
assert d["ok"] is True, "ok is not true"
assert d["devices"] and all(x["name"] for x in d["devices"]), "no devices"
assert d["date"].endswith("Z") and d["commit"], "date / commit"
assert len(m) == want, f"{len(m)} modes, want {want}"
for x in m:
    assert x["jobs"] > 0 and x["rows"] == x["jobs"] * x["segments_per_job"], x
    assert x["rows_per_s"] > 0 and x["mean_latency_us"] > 0, x
    assert x["checked_rows"] > 0 and x["mismatches"] == 0 and x["errors"] == 0, x
assert m[0]["mode"] == "unbatched" and len(d["ratios"]) == want - 1, d["ratios"]
print("json ok:", ", ".join(f"{x['mode']} {x['rows_per_s']:.0f} rows/s" for x in m))
