"""The Grafana dashboard (monitoring/grafana-dashboard.json): its queries, the
metrics and labels they read, and what the programs serve."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from conftest import K8S_DIR

DASHBOARD = os.path.join(K8S_DIR, "monitoring", "grafana-dashboard.json")

# Grafana's variables, as the checks fill them in.
VARIABLES = {"$__rate_interval": "5m", "$namespace": "agentmesh"}
# Labels Prometheus adds to every scraped series; `le` of histogram buckets.
ADDED_LABELS = {"namespace", "pod", "job", "instance", "container", "service", "endpoint"}

METRIC = re.compile(r"\b(agentmesh_[a-z0-9_]+)\b")
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")


def load(path: str = DASHBOARD) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title / refId, expression with variables filled in) of every target."""
    out = []
    panels = list(dashboard.get("panels") or [])
    for p in panels:
        panels.extend(p.get("panels") or [])
    for p in panels:
        for t in p.get("targets") or []:
            expr = str(t.get("expr", ""))
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            out.append((f"{p.get('title')} / {t.get('refId')}", expr))
    return out


def structure_problems(dashboard: dict[str, Any]) -> list[str]:
    """Unique panel ids, every non-row panel with a query, no variable left unfilled."""
    problems = []
    ids = [p.get("id") for p in dashboard.get("panels") or []]
    if len(ids) != len(set(ids)):
        problems.append("panel ids are not unique")
    for p in dashboard.get("panels") or []:
        if p.get("type") != "row" and not p.get("targets"):
            problems.append(f"panel {p.get('title')!r} has no query")
    for where, expr in queries(dashboard):
        if not expr.strip():
            problems.append(f"{where}: empty query")
        if "$" in expr:
            problems.append(f"{where}: a variable the checks do not know: {expr}")
    return problems


def parse_exposition(text: str) -> dict[str, set[str]]:
    """Sample name -> label names, from a Prometheus text exposition."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s", line)
        if not m:
            continue
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"", m.group(2) or ""))
        out.setdefault(m.group(1), set()).update(labels)
    return out


def served_problems(dashboard: dict[str, Any], served: dict[str, set[str]]) -> list[str]:
    """Every metric a query reads is served; every label it groups or matches
    by is on one of its metrics (or added by Prometheus)."""
    problems = []
    for where, expr in queries(dashboard):
        names = set(METRIC.findall(expr))
        if not names:
            problems.append(f"{where}: reads no agentmesh metric: {expr}")
        labels = set(ADDED_LABELS)
        for n in sorted(names):
            if n not in served:
                problems.append(f"{where}: {n} is served by no program")
            else:
                labels |= served[n]
        used = {x.strip() for g in BY.findall(expr) for x in g.split(",") if x.strip()}
        used |= {m.group(1) for g in MATCHER.findall(expr) for m in re.finditer(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", g)}
        for label in sorted(used - labels):
            problems.append(f"{where}: label {label!r} is on none of {sorted(names)}")
    return problems


def promtool_rules(dashboard: dict[str, Any]) -> str:
    """Every query as a recording rule, for `promtool check rules`."""
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries(dashboard))]
    return json.dumps({"groups": [{"name": "grafana-dashboard", "rules": rules}]})
