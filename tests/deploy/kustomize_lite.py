"""The subset of kustomize that deploy/k8s uses (resources, configMapGenerator
without name hashes, images, JSON 6902 patches with a target), so the
overlays render offline with no kustomize binary. Anything else in a
kustomization is refused, and check_deploy.py compares this output with
`kubectl kustomize` wherever kubectl exists."""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, List

import yaml

KNOWN = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "images", "patches"}


def _pointer(doc: Any, path: str):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    parent = doc
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    return parent, parts[-1]


def apply_json6902(doc: Dict, ops: List[Dict]) -> None:
    for op in ops:
        parent, last = _pointer(doc, op["path"])
        if op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "replace":
            key = int(last) if isinstance(parent, list) else last
            if not isinstance(parent, list) and key not in parent:
                raise ValueError(f"replace of a missing path {op['path']}")
            parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError(f"JSON patch op {op['op']} is not supported here")


def render(folder: str) -> List[Dict]:
    with open(os.path.join(folder, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KNOWN
    if unknown:
        raise ValueError(f"{folder}: kustomization fields not supported here: {sorted(unknown)}")
    docs: List[Dict] = []
    for r in k.get("resources", []):
        path = os.path.join(folder, r)
        if os.path.isdir(path):
            docs += render(path)
        else:
            with open(path) as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    opts = k.get("generatorOptions", {})
    if k.get("configMapGenerator") and not opts.get("disableNameSuffixHash"):
        raise ValueError(f"{folder}: name hashes are not reproduced here")
    for g in k.get("configMapGenerator", []):
        data = {}
        for name in g.get("files", []):
            with open(os.path.join(folder, name)) as f:
                data[os.path.basename(name)] = f.read()
        meta = {"name": g["name"]}
        if opts.get("labels"):
            meta["labels"] = dict(opts["labels"])
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for img in k.get("images", []):
        for d in docs:
            for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if c["image"].split(":")[0] == img["name"]:
                    c["image"] = f"{img.get('newName', img['name'])}:{img['newTag']}"
    for p in k.get("patches", []):
        t = p["target"]
        hits = [d for d in docs if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]]
        if len(hits) != 1:
            raise ValueError(f"{folder}: patch target {t} matches {len(hits)} resources")
        apply_json6902(hits[0], yaml.safe_load(p["patch"]))
    return docs
