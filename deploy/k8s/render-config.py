#!/usr/bin/env python3
"""Renders base/lnormd.conf, the config file of the lnormd pods, from
deploy/lnormd.conf (every key, commented out, at its default): the keys
below are set, every other line is kept as it is, so the file in the
ConfigMap documents every key. tests/deploy checks the result is current.
    deploy/k8s/render-config.py > deploy/k8s/base/lnormd.conf"""
import os
import sys

# The pod's network namespace is its own: serve on every interface in it.
SETTINGS = [
    ("listen", ["tcp://0.0.0.0:7878", "ipc:///run/lnormd/lnormd.sock"]),
    ("http", ["0.0.0.0:7879"]),
    # terminationGracePeriodSeconds (deployment.yaml) covers preStop + this drain.
    ("drain-timeout-ms", ["25000"]),
]


def render(text: str) -> str:
    out, done = [], set()
    for line in text.splitlines():
        body = line[2:] if line.startswith("# ") else None
        key = body.split("=", 1)[0].strip() if body and "=" in body else None
        wanted = dict(SETTINGS)
        if key in wanted and " " not in key and key not in done:
            out += [f"{key} = {v}" for v in wanted[key]]
            done.add(key)
            continue
        out.append(line)
    missing = [k for k, _ in SETTINGS if k not in done]
    if missing:
        raise SystemExit(f"render-config: keys not in deploy/lnormd.conf: {missing}")
    head = "# Rendered by deploy/k8s/render-config.py from deploy/lnormd.conf: edit those, not this.\n"
    return head + "\n".join(out) + "\n"


if __name__ == "__main__":
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lnormd.conf")
    sys.stdout.write(render(open(sys.argv[1] if len(sys.argv) > 1 else src).read()))
