"""Read-only helpers over rendered objects: workloads, containers, flags, quantities.

The checks in checks.py reason about what a pod will actually run: the flags
after Kubernetes expands $(VAR) references from env and ConfigMaps, the files
those flags name, the ports they listen on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterator

VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

BINARIES = ("agentmesh-control-plane", "agentmesh-router", "agentmesh-node")

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")

# The flag naming each program's HTTP listener: /metrics, /healthz, /readyz
# (and the router's POST /drain). Probes, monitors and NetworkPolicies use it.
HTTP_LISTENER_FLAG = {"agentmesh-router": "--metrics-addr", "agentmesh-control-plane": "--http-addr"}


@dataclass
class Container:
    """One container of a workload, with what is needed to reason about its flags."""

    workload: dict[str, Any]
    pod_spec: dict[str, Any]
    pod_labels: dict[str, str]
    spec: dict[str, Any]
    env_values: dict[str, str | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def where(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}/{self.name}"

    @property
    def binary(self) -> str | None:
        """The agentmesh program this container runs, if any."""
        cmd = self.spec.get("command") or []
        if cmd:
            base = str(cmd[0]).rsplit("/", 1)[-1]
            if base in BINARIES:
                return base
        return None

    @property
    def subcommand(self) -> str | None:
        """The positional arguments before the first flag (e.g. `backup`,
        `store copy`), if any."""
        words = self._subcommand_words()
        return " ".join(words) if words else None

    def _subcommand_words(self) -> list[str]:
        words = []
        for a in self.spec.get("args") or []:
            if str(a).startswith("-"):
                break
            words.append(str(a))
        return words

    def port_number(self, port: Any) -> int | None:
        """Resolves a named or numbered container port."""
        for p in self.spec.get("ports", []) or []:
            if p.get("name") == port or p.get("containerPort") == port:
                return p["containerPort"]
        return None

    def flags(self) -> dict[str, list[str]]:
        """Flag name -> raw values as written in args (before expansion)."""
        out: dict[str, list[str]] = {}
        args = [str(a) for a in self.spec.get("args", []) or []]
        args = args[len(self._subcommand_words()) :]
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                if "=" in a:
                    name, value = a.split("=", 1)
                elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                    name, value = a, args[i + 1]
                    i += 1
                else:
                    name, value = a, ""
                out.setdefault(name, []).append(value)
            i += 1
        return out

    def expand(self, value: str) -> str:
        """Expands $(VAR) as the kubelet does; vars from the downward API stay as $(VAR)."""

        def sub(m: re.Match[str]) -> str:
            v = self.env_values.get(m.group(1))
            return m.group(0) if v is None else v

        return VAR_REF.sub(sub, value)

    def flag(self, name: str) -> str | None:
        """The expanded value of a single-valued flag, or None when absent."""
        values = self.flags().get(name)
        return self.expand(values[-1]) if values else None

    def env_entry(self, name: str) -> dict[str, Any] | None:
        """The container's own `env` item named `name`, if any."""
        for e in self.spec.get("env", []) or []:
            if e.get("name") == name:
                return e
        return None

    def secret_ref(self, value: str | None) -> tuple[str, str] | None:
        """(Secret, key) when `value` is exactly `$(VAR)` and VAR is an env item
        read from a Secret (`valueFrom.secretKeyRef`), else None."""
        m = VAR_REF.fullmatch(value or "")
        e = self.env_entry(m.group(1)) if m else None
        ref = ((e or {}).get("valueFrom") or {}).get("secretKeyRef")
        return (ref["name"], ref["key"]) if ref else None

    def mounts(self) -> list[dict[str, Any]]:
        return list(self.spec.get("volumeMounts", []) or [])

    def volume(self, name: str) -> dict[str, Any] | None:
        for v in self.pod_spec.get("volumes", []) or []:
            if v.get("name") == name:
                return v
        if self.workload["kind"] == "StatefulSet":
            for t in self.workload["spec"].get("volumeClaimTemplates", []) or []:
                if t["metadata"]["name"] == name:
                    return {"name": name, "persistentVolumeClaim": {"claimName": f"{name}-<pod>"}}
        return None


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    """The object of `kind` named `name`, if rendered."""
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    return None


def pod_template(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template of a workload (CronJob: its job's template)."""
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]
    if obj["kind"] in WORKLOAD_KINDS:
        return obj["spec"]["template"]
    return None


def workloads(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for o in objects:
        if o["kind"] in WORKLOAD_KINDS:
            yield o


def containers(objects: list[dict[str, Any]]) -> Iterator[Container]:
    """Every container and init container of every workload, env resolved."""
    for w in workloads(objects):
        tpl = pod_template(w) or {}
        spec = tpl.get("spec", {})
        labels = tpl.get("metadata", {}).get("labels", {}) or {}
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            cont = Container(w, spec, labels, c)
            cont.env_values = resolve_env(cont, objects)
            yield cont


def resolve_env(c: Container, objects: list[dict[str, Any]]) -> dict[str, str | None]:
    """Env as the kubelet builds it: envFrom first, then env in order.

    Values from the downward API are None (known only at run time)."""
    env: dict[str, str | None] = {}
    for src in c.spec.get("envFrom", []) or []:
        ref = src.get("configMapRef")
        if ref:
            cm = find(objects, "ConfigMap", ref["name"])
            for k, v in ((cm or {}).get("data") or {}).items():
                env[src.get("prefix", "") + k] = str(v)
    for e in c.spec.get("env", []) or []:
        if "value" in e:
            env[e["name"]] = VAR_REF.sub(lambda m: env.get(m.group(1)) or m.group(0), str(e["value"]))
        else:
            env[e["name"]] = None
    return env


def parse_quantity(q: Any) -> float:
    """A Kubernetes quantity (`512Mi`, `2Gi`, `500m`, `2`) as a number of units."""
    s = str(q).strip()
    suffixes = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "m": 1e-3,
    }
    for suf, mult in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(suf):
            return float(s[: -len(suf)]) * mult
    return float(s)


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """matchLabels / plain-map selector semantics (matchExpressions unsupported: no match)."""
    if not selector:
        return False
    if "matchExpressions" in selector:
        return False
    wanted = selector.get("matchLabels", selector if "matchLabels" not in selector else {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def pod_label_sets(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """(workload, labels) for every pod the workloads will create.

    StatefulSet pods also carry `statefulset.kubernetes.io/pod-name`, one
    label set per ordinal."""
    out = []
    for w in workloads(objects):
        tpl = pod_template(w) or {}
        labels = dict(tpl.get("metadata", {}).get("labels", {}) or {})
        if w["kind"] == "StatefulSet":
            for i in range(int(w["spec"].get("replicas", 1))):
                out.append((w, {**labels, "statefulset.kubernetes.io/pod-name": f"{w['metadata']['name']}-{i}"}))
        else:
            out.append((w, labels))
    return out


def sqlite_path(db: str | None) -> str | None:
    """The file path inside a `sqlite://PATH` URL, or None for anything else."""
    if db and db.startswith("sqlite://"):
        return db[len("sqlite://") :]
    return None


# The control plane's --db default (controlplane/src/config/mod.rs).
DEFAULT_DB = "sqlite://./agentmesh-data/controlplane.db"


def store_kind(c: Container) -> str:
    """Which store a control-plane container runs on: `sqlite` (a sqlite://
    URL, or no --db: the default is a SQLite file), else `postgres` (the only
    other scheme `--db` takes; its URL may be known only at run time, from a
    Secret)."""
    db = c.flag("--db")
    return "sqlite" if sqlite_path(db if db is not None else DEFAULT_DB) else "postgres"


def addr_port(addr: str | None) -> int | None:
    """The port of `host:port` or of a /tcp/PORT multiaddr."""
    if not addr:
        return None
    m = re.search(r"/tcp/(\d+)", addr)
    if m:
        return int(m.group(1))
    m = re.search(r":(\d+)$", addr)
    return int(m.group(1)) if m else None
