"""Structural checks for the prometheus-operator objects, which have no schema
in kubernetes-validate: PodMonitor, ServiceMonitor and PrometheusRule.

Alert expressions are checked for shape (balanced brackets, durations) and for
the metrics and labels they name: every metric must be one the programs
export (or `up` / kube-state-metrics), with labels those metrics have.
"""

from __future__ import annotations

import os
import re
from typing import Any

from model import HTTP_LISTENER_FLAG, addr_port, containers, pod_label_sets, selector_matches

MONITORING_API = "monitoring.coreos.com/v1"

# Every alert's runbook: a section of deploy/k8s/README.md, by its anchor.
RUNBOOK_DOC = "deploy/k8s/README.md"
README_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def readme_anchors(path: str = README_PATH) -> set[str]:
    """Anchors of every heading in the README."""
    with open(path, encoding="utf-8") as f:
        return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", f.read(), re.MULTILINE)}


def runbook_problems(alert: str, url: Any, anchors: set[str]) -> list[str]:
    """An alert's runbook_url must name a section of the README that exists."""
    if not url:
        return [f"{alert}: no runbook_url annotation"]
    m = re.fullmatch(re.escape(RUNBOOK_DOC) + r"#([\w-]+)", str(url))
    if not m:
        return [f"{alert}: runbook_url {url!r} is not {RUNBOOK_DOC}#<section>"]
    if m.group(1) not in anchors:
        return [f"{alert}: runbook_url {url!r}: no such section in {RUNBOOK_DOC}"]
    return []
MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}

# Labels Prometheus attaches to every scraped series (operator relabeling).
TARGET_LABELS = {"namespace", "pod", "job", "instance", "container", "service", "endpoint"}

# Metrics the programs export (issues 2, 3, 4) -> their labels, and the
# values a label may take where the issues fix them.
METRICS: dict[str, set[str]] = {
    "agentmesh_router_refused_total": {"resource", "scope", "protocol"},
    "agentmesh_router_trimmed_total": {"reason"},
    "agentmesh_router_goaway_sent_total": {"reason", "result"},
    "agentmesh_router_ready": set(),
    "agentmesh_router_lease_total": {"result"},
    "agentmesh_router_memory_in_use_bytes": set(),
    "agentmesh_router_memory_budget_bytes": set(),
    "agentmesh_router_auth_total": {"purpose", "result"},
    "agentmesh_runtime_stalls_total": {"cause"},
    "agentmesh_control_plane_storage_rows": {"table"},
    "agentmesh_control_plane_deleted_total": {"table", "reason"},
    "agentmesh_control_plane_next_key_rotation_timestamp_seconds": set(),
    "agentmesh_control_plane_limiter_refusals_total": {"limiter"},
    "up": set(),
    "kube_statefulset_status_replicas_ready": {"statefulset"},
    "kube_statefulset_replicas": {"statefulset"},
}
CONTROL_PLANE_TABLES = {
    "nodes",
    "enrollment_requests",
    "tokens",
    "router_leases",
    "signing_keys",
    "rotation_state",
    "revocations",
}
LABEL_VALUES: dict[tuple[str, str], set[str]] = {
    ("agentmesh_router_refused_total", "resource"): {"connection", "stream", "memory", "reservation", "circuit"},
    ("agentmesh_router_refused_total", "scope"): {"system", "protocol", "peer", "source"},
    ("agentmesh_router_goaway_sent_total", "reason"): {"draining", "overloaded"},
    ("agentmesh_router_goaway_sent_total", "result"): {"acked", "timeout", "unsupported", "error", "on_auth"},
    ("agentmesh_router_trimmed_total", "reason"): {"unauthenticated", "other_routers", "only_router"},
    ("agentmesh_router_lease_total", "result"): {"ok", "error"},
    ("agentmesh_router_auth_total", "result"): {
        "admitted",
        "malformed",
        "bad_signature",
        "unknown_key",
        "expired",
        "not_yet_valid",
        "wrong_peer",
        "revoked",
        "wrong_role",
        "no_keys",
        "io",
    },  # fmt: skip
    ("agentmesh_control_plane_limiter_refusals_total", "limiter"): {"enroll", "refresh", "failure_guard", "db_busy"},
    ("agentmesh_runtime_stalls_total", "cause"): {"busy", "starved", "blocked", "unknown"},
    ("agentmesh_control_plane_storage_rows", "table"): CONTROL_PLANE_TABLES,
    ("agentmesh_control_plane_deleted_total", "table"): CONTROL_PLANE_TABLES,
}
# What the alerts must cover (the brief and issue 6).
REQUIRED_METRICS = {
    "agentmesh_router_refused_total",
    "agentmesh_router_trimmed_total",
    "agentmesh_router_goaway_sent_total",
    "agentmesh_router_ready",
    "agentmesh_runtime_stalls_total",
    "agentmesh_control_plane_storage_rows",
    "agentmesh_control_plane_next_key_rotation_timestamp_seconds",
}

PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SEVERITIES = {"info", "warning", "critical"}


def _balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    in_str = False
    prev = ""
    for ch in expr:
        if ch == '"' and prev != "\\":
            in_str = not in_str
        elif not in_str:
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                if not stack or stack.pop() != pairs[ch]:
                    return False
        prev = ch
    return not stack and not in_str


def promql_problems(expr: str) -> list[str]:
    """Problems with one PromQL expression: shape, metric names, label names and values."""
    if not expr.strip():
        return ["empty expression"]
    if not _balanced(expr):
        return [f"unbalanced brackets or quotes in {expr!r}"]
    problems = []
    metrics: list[str] = []
    for metric, body in SELECTOR.findall(expr):
        if metric in PROMQL_KEYWORDS:
            continue
        rest = body
        while rest.strip():
            m = MATCHER.match(rest)
            if not m:
                problems.append(f"{metric}: cannot read label matchers {body!r}")
                break
            label, op, value = m.groups()
            if metric in METRICS and label not in METRICS[metric] | TARGET_LABELS:
                problems.append(f"{metric} has no label {label}")
            allowed = LABEL_VALUES.get((metric, label))
            # Exact matchers, and regex matchers that are plain alternations.
            values = [value] if op in ("=", "!=") else value.split("|")
            if allowed and all(re.fullmatch(r"[a-z_]+", v) for v in values):
                for v in values:
                    if v not in allowed:
                        problems.append(f"{metric}{{{label}}} never takes the value {v!r}")
            rest = rest[m.end() :]
            if rest.startswith(","):
                rest = rest[1:]
    # Identifiers that are not functions, keywords, label names or durations.
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    grouping_labels = {lbl.strip() for _, lbls in GROUPING.findall(stripped) for lbl in lbls.split(",") if lbl.strip()}
    stripped = GROUPING.sub(" ", stripped)
    stripped = re.sub(r"\{[^}]*\}", " ", stripped)
    stripped = re.sub(r"\[[^\]]*\]", " ", stripped)
    for m in IDENT.finditer(stripped):
        word = m.group(0)
        after = stripped[m.end() :].lstrip()
        if after.startswith("(") or word in PROMQL_KEYWORDS or word in ("time", "vector"):
            continue
        metrics.append(word)
    for metric in metrics:
        if metric not in METRICS:
            problems.append(f"unknown metric {metric!r}")
    known_labels = set(TARGET_LABELS)
    for metric in metrics:
        known_labels |= METRICS.get(metric, set())
    for label in grouping_labels - known_labels:
        problems.append(f"groups by label {label!r} that none of {sorted(set(metrics))} has")
    for d in re.findall(r"\[([^\]]*)\]", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        for part in d.split(":"):
            if part and not DURATION.match(part.strip()):
                problems.append(f"bad duration {part!r}")
    return problems


def metrics_of(expr: str) -> set[str]:
    """Metric names an expression reads (those in METRICS)."""
    return {m for m in METRICS if re.search(rf"\b{re.escape(m)}\b", expr)}


def check_rules(objects: list[dict[str, Any]]) -> list[str]:
    """PrometheusRule objects: well-formed alerts that cover the required metrics."""
    problems: list[str] = []
    rules = [o for o in objects if o["kind"] == "PrometheusRule"]
    if not rules:
        return problems
    names: set[str] = set()
    covered: set[str] = set()
    anchors = readme_anchors()
    for r in rules:
        where = f"PrometheusRule/{r['metadata']['name']}"
        if r.get("apiVersion") != MONITORING_API:
            problems.append(f"{where}: apiVersion {r.get('apiVersion')}")
        groups = (r.get("spec") or {}).get("groups") or []
        if not groups:
            problems.append(f"{where}: no rule groups")
        for g in groups:
            if not g.get("name") or not g.get("rules"):
                problems.append(f"{where}: group without name or rules")
            for rule in g.get("rules") or []:
                alert = rule.get("alert")
                if not alert or not re.fullmatch(r"Agentmesh[A-Z][A-Za-z0-9]+", alert):
                    problems.append(f"{where}: alert name {alert!r} is not AgentmeshCamelCase")
                    continue
                if alert in names:
                    problems.append(f"{where}: alert {alert} defined twice")
                names.add(alert)
                extra = set(rule) - {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
                if extra:
                    problems.append(f"{alert}: unknown fields {sorted(extra)}")
                expr = str(rule.get("expr", ""))
                problems += [f"{alert}: {p}" for p in promql_problems(expr)]
                covered |= metrics_of(expr)
                if "for" in rule and not DURATION.match(str(rule["for"])):
                    problems.append(f"{alert}: bad `for` {rule['for']!r}")
                if (rule.get("labels") or {}).get("severity") not in SEVERITIES:
                    problems.append(f"{alert}: severity must be one of {sorted(SEVERITIES)}")
                ann = rule.get("annotations") or {}
                for key in ("summary", "description"):
                    if not str(ann.get(key, "")).strip():
                        problems.append(f"{alert}: no {key} annotation")
                problems += runbook_problems(alert, ann.get("runbook_url"), anchors)
    for m in sorted(REQUIRED_METRICS - covered):
        problems.append(f"no alert reads {m}")
    return problems


def check_monitors(objects: list[dict[str, Any]]) -> list[str]:
    """PodMonitor / ServiceMonitor: well-formed, and when the workloads are rendered
    too, they scrape every program's metrics listener by a port that exists."""
    problems: list[str] = []
    monitors = [o for o in objects if o["kind"] in ("PodMonitor", "ServiceMonitor")]
    for mon in monitors:
        where = f"{mon['kind']}/{mon['metadata']['name']}"
        if mon.get("apiVersion") != MONITORING_API:
            problems.append(f"{where}: apiVersion {mon.get('apiVersion')}")
        spec = mon.get("spec") or {}
        if not (spec.get("selector") or {}).get("matchLabels"):
            problems.append(f"{where}: no selector.matchLabels")
        eps = spec.get("podMetricsEndpoints" if mon["kind"] == "PodMonitor" else "endpoints") or []
        if not eps:
            problems.append(f"{where}: no endpoints")
        for ep in eps:
            if not isinstance(ep.get("port"), str):
                problems.append(f"{where}: endpoint needs a named port")
            if ep.get("path", "/metrics") != "/metrics":
                problems.append(f"{where}: scrapes {ep.get('path')}, programs serve /metrics")
            for key in ("interval", "scrapeTimeout"):
                if key in ep and not DURATION.match(str(ep[key])):
                    problems.append(f"{where}: bad {key} {ep[key]!r}")

    if not monitors or not pod_label_sets(objects):
        return problems
    for c in containers(objects):
        flag = HTTP_LISTENER_FLAG.get(c.binary or "")
        if not flag or c.subcommand:
            continue
        port = addr_port(c.flag(flag))
        scraped = 0
        for mon in monitors:
            spec = mon.get("spec") or {}
            if mon["kind"] == "PodMonitor":
                if selector_matches(spec.get("selector"), c.pod_labels):
                    scraped += sum(
                        c.port_number(ep.get("port")) == port for ep in spec.get("podMetricsEndpoints") or []
                    )
            else:
                for svc in objects:
                    if svc["kind"] != "Service" or not selector_matches(
                        spec.get("selector"), svc["metadata"].get("labels", {})
                    ):
                        continue
                    if not selector_matches(svc["spec"].get("selector"), c.pod_labels):
                        continue
                    for ep in spec.get("endpoints") or []:
                        for sp in svc["spec"].get("ports", []):
                            if sp.get("name") == ep.get("port") and c.port_number(sp.get("targetPort")) == port:
                                scraped += 1
        if not scraped:
            problems.append(f"{c.where}: no monitor scrapes its metrics listener (port {port})")
        elif scraped > 1:
            problems.append(
                f"{c.where}: its metrics listener (port {port}) is scraped {scraped} times (e.g. through two "
                "Services): every series would be doubled"
            )
    return problems


def is_monitoring(obj: dict[str, Any]) -> bool:
    """Whether an object is one of the prometheus-operator kinds we ship."""
    return obj.get("apiVersion") == MONITORING_API and obj["kind"] in MONITORING_KINDS
