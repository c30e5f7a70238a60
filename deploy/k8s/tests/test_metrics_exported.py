"""Every agentmesh metric an alert reads is one the programs register.

Looks for the registered names among the string literals of the Rust sources
(counters are registered without `_total`; sub-registries add a prefix), so a
renamed metric breaks this test instead of silently muting an alert."""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import REPO_ROOT, render
from monitoring import metrics_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def workspace_members():
    with open(os.path.join(REPO_ROOT, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["members"]


def rust_literals():
    out = set()
    for crate in workspace_members():
        for root, _, files in os.walk(os.path.join(REPO_ROOT, crate, "src")):
            for name in files:
                if name.endswith(".rs"):
                    with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                        out.update(re.findall(r'"([a-z_:][a-z0-9_:]*)"', f.read()))
    return out


def registered(metric, literals):
    base = metric[: -len("_total")] if metric.endswith("_total") else metric
    if base in literals:
        return True
    return any(
        base.startswith(p + "_") and base[len(p) + 1 :] in literals for p in literals if p.startswith("agentmesh")
    )


def alerted_metrics():
    rule = next(o for o in render("monitoring") if o["kind"] == "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    return sorted({m for e in exprs for m in metrics_of(e) if m.startswith("agentmesh_")})


def test_registration_lookup_sees_prefixed_and_counter_names():
    lits = {"agentmesh_control_plane", "storage_rows", "agentmesh_router_refused"}
    assert registered("agentmesh_control_plane_storage_rows", lits)
    assert registered("agentmesh_router_refused_total", lits)
    assert not registered("agentmesh_router_refusals_total", lits)


@pytest.mark.parametrize("metric", alerted_metrics())
def test_alerted_metric_is_registered_by_a_program(metric):
    assert registered(metric, rust_literals()), f"no program registers {metric}: its alerts would never fire"
