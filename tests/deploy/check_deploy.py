"""deploy.check: the container and Kubernetes files, offline.

- hadolint passes the Containerfiles; the scripts parse (bash -n);
- lnormd accepts the container's and the pods' config files (started with
  each, on loopback ports) and drains on SIGTERM with exit status 0;
- deploy/k8s/base/lnormd.conf is what render-config.py makes of
  deploy/lnormd.conf;
- the base and both overlays render (kustomize_lite.py, compared with
  `kubectl kustomize` where kubectl exists) and every object passes
  kubernetes-validate's strict schema of Kubernetes KUBE_VERSION; the
  ServiceMonitor (a CRD) passes its own schema below;
- selectors, ports, probes, grace period and GPU requests agree with each
  other and with lnormd;
- every metric the Grafana dashboard, the HPA's adapter rule and the
  dashboard's variable name is one a running lnormd exports.

    python check_deploy.py SOURCE_DIR LNORMD
Prints one line per check and 'N passed, N failed, N skipped'."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import jsonschema
import kubernetes_validate
import yaml

import kustomize_lite

KUBE_VERSION = "1.34.0"
src, lnormd = sys.argv[1], sys.argv[2]
k8s = os.path.join(src, "deploy", "k8s")
container = os.path.join(src, "deploy", "container")
results = {"passed": 0, "failed": 0, "skipped": 0}


def report(name: str, ok, detail: str = "") -> None:
    state = "skipped" if ok is None else "passed" if ok else "failed"
    results[state] += 1
    print(f"{state.upper():7} {name}" + (f": {detail}" if detail else ""), flush=True)


def check(name: str, fn) -> None:
    try:
        detail = fn()
        report(name, True, detail or "")
    except Exception as e:  # one failing check does not hide the others
        report(name, False, f"{type(e).__name__}: {e}")


def hadolint():
    files = [os.path.join(container, f) for f in ("Containerfile.cpu", "Containerfile.gpu")]
    p = subprocess.run(["hadolint", "--config", os.path.join(container, ".hadolint.yaml"), *files],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def scripts_parse():
    for f in ("smoke.sh",):
        subprocess.run(["bash", "-n", os.path.join(container, f)], check=True)
    path = os.path.join(container, "load.py")
    with open(path) as f:
        compile(f.read(), path, "exec")


def run_lnormd(config: str) -> str:
    """Start lnormd with a config file (listeners moved to loopback), read
    /metrics, SIGTERM it; returns the metrics text."""
    tmp = tempfile.mkdtemp(prefix="lnorm-deploy-")
    try:
        ready = os.path.join(tmp, "ready")
        log = open(os.path.join(tmp, "log"), "w+")
        p = subprocess.Popen([lnormd, "--config", config, "--backend", "cpu", "--cpu-threads", "1",
                              "--listen", f"ipc://{tmp}/s", "--http", "127.0.0.1:0", "--ready-file", ready],
                             stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 20
        while not (os.path.exists(ready) and os.path.getsize(ready) > 0):
            if p.poll() is not None or time.monotonic() > end:
                p.kill()
                log.seek(0)
                raise AssertionError(f"lnormd did not start with {config}: {log.read()[-2000:]}")
            time.sleep(0.02)
        http = next(ln.split()[1] for ln in open(ready) if ln.startswith("http "))
        text = urllib.request.urlopen(f"http://{http}/metrics", timeout=5).read().decode()
        for path in ("/healthz", "/readyz"):
            assert urllib.request.urlopen(f"http://{http}{path}", timeout=5).status == 200, path
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0, "lnormd did not exit 0 on SIGTERM"
        return text
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


metrics_text = ""


def configs_accepted():
    global metrics_text
    metrics_text = run_lnormd(os.path.join(container, "lnormd.conf"))
    run_lnormd(os.path.join(k8s, "base", "lnormd.conf"))


def config_rendered():
    got = subprocess.run([sys.executable, os.path.join(k8s, "render-config.py")], check=True,
                         capture_output=True, text=True).stdout
    with open(os.path.join(k8s, "base", "lnormd.conf")) as f:
        assert f.read() == got, "deploy/k8s/base/lnormd.conf is stale: run deploy/k8s/render-config.py"


SERVICE_MONITOR_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                 "properties": {
                     "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}}}}}}},
}

rendered = {}


def render_all():
    have_kubectl = shutil.which("kubectl") is not None
    for name in ("base", "overlays/cpu", "overlays/gpu"):
        docs = kustomize_lite.render(os.path.join(k8s, name))
        rendered[name] = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        if have_kubectl:
            out = subprocess.run(["kubectl", "kustomize", os.path.join(k8s, name)], check=True,
                                 capture_output=True, text=True).stdout
            ref = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
            assert ref == rendered[name], f"{name}: kustomize_lite differs from kubectl kustomize"
    return "compared with kubectl kustomize" if have_kubectl else "kubectl absent: not compared"


def validate_all():
    n = 0
    for name, docs in rendered.items():
        for (kind, obj), d in docs.items():
            if kind == "ServiceMonitor":
                jsonschema.validate(d, SERVICE_MONITOR_SCHEMA)
            else:
                kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
            n += 1
    with open(os.path.join(k8s, "monitoring", "prometheus-adapter-rules.yaml")) as f:
        for d in yaml.safe_load_all(f):
            kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
            n += 1
    return f"{n} objects against Kubernetes {KUBE_VERSION}"


def consistency():
    for name, docs in rendered.items():
        dep = docs[("Deployment", "lnormd")]
        pod = dep["spec"]["template"]
        labels = pod["metadata"]["labels"]
        sel = lambda m: all(labels.get(k) == v for k, v in m.items())  # noqa: E731
        assert sel(dep["spec"]["selector"]["matchLabels"]), name
        svc = docs[("Service", "lnormd")]
        assert svc["spec"]["clusterIP"] == "None" and sel(svc["spec"]["selector"]), f"{name}: headless Service"
        assert sel(docs[("PodDisruptionBudget", "lnormd")]["spec"]["selector"]["matchLabels"]), name
        sm = docs[("ServiceMonitor", "lnormd")]
        assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        c = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports), name
        assert all(e["port"] in {p["name"] for p in svc["spec"]["ports"]} for e in sm["spec"]["endpoints"])
        probes = {k: c[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
        assert all(p["port"] in ports for p in probes.values()), name
        ann = pod["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["http"]
        conf = docs[("ConfigMap", "lnormd-config")]["data"]["lnormd.conf"]
        keys = dict(re.findall(r"^([a-z-]+) = (.*)$", conf, re.M))
        assert keys["http"].endswith(f":{ports['http']}"), "http port of the config and the container differ"
        assert f":{ports['nng']}" in conf, "no listener on the nng port"
        drain_s = int(keys["drain-timeout-ms"]) / 1000
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        pre_s = float(pre[1]) if pre[0] == "sleep" else 0
        assert pod["spec"]["terminationGracePeriodSeconds"] >= pre_s + drain_s + 1, \
            f"{name}: grace period shorter than preStop + drain"
        vol = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert vol["config"]["configMap"]["name"] == "lnormd-config"
        gpu = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        backend = c["args"][c["args"].index("--backend") + 1] if "--backend" in c["args"] else None
        if name == "overlays/gpu":
            assert gpu == 1 and backend == "cuda" and c["image"].endswith(":gpu"), name
        elif name == "overlays/cpu":
            assert gpu is None and backend == "cpu" and c["image"].endswith(":cpu"), name
        hpa = docs[("HorizontalPodAutoscaler", "lnormd")]
        assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]


def metric_names_exist():
    exported = set(re.findall(r"^(lnormd_[a-z0-9_]+)", metrics_text, re.M))
    assert len(exported) > 20, "too few metrics read from lnormd"
    with open(os.path.join(k8s, "monitoring", "grafana-lnormd.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v.get("query", "") for v in dash["templating"]["list"]]
    with open(os.path.join(k8s, "monitoring", "prometheus-adapter-rules.yaml")) as f:
        exprs.append(yaml.safe_load(f)["data"]["config.yaml"])
    used = set()
    for e in exprs:
        used |= set(re.findall(r"\b(lnormd_[a-z0-9_]+)", e))
    used.discard("lnormd_queue_wait_seconds")  # the adapter's own name for the HPA
    missing = sorted(used - exported)
    assert not missing, f"not exported by lnormd: {missing}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    return f"{len(used)} metric names"


check("hadolint Containerfile.cpu Containerfile.gpu", hadolint)
check("scripts parse", scripts_parse)
check("lnormd accepts the container and pod config files", configs_accepted)
check("deploy/k8s/base/lnormd.conf is current", config_rendered)
check("kustomize base, overlays/cpu, overlays/gpu", render_all)
if rendered:
    check("Kubernetes schemas (strict)", validate_all)
    check("selectors, ports, probes, grace period, GPU", consistency)
else:
    report("Kubernetes schemas (strict)", None, "nothing rendered")
if metrics_text:
    check("dashboard and HPA metrics exist in lnormd", metric_names_exist)
else:
    report("dashboard and HPA metrics exist in lnormd", None, "lnormd did not run")
print(f"{results['passed']} passed, {results['failed']} failed, {results['skipped']} skipped")
sys.exit(1 if results["failed"] or results["skipped"] else 0)
