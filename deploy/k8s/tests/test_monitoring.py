"""PodMonitor, ServiceMonitor and PrometheusRule: checked structurally (no schema)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from conftest import render
from monitoring import MONITORING_KINDS, check_monitors, check_rules, promql_problems, readme_anchors


def test_monitoring_objects_are_well_formed(target):
    objects = render(target)
    assert check_rules(objects) == []
    assert check_monitors(objects) == []


def test_production_ships_monitors_and_rules():
    kinds = {o["kind"] for o in render("overlays/production")}
    assert MONITORING_KINDS <= kinds


def rules(objects):
    return next(o for o in objects if o["kind"] == "PrometheusRule")["spec"]["groups"]


def alert(objects, name):
    return next(r for g in rules(objects) for r in g["rules"] if r["alert"] == name)


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("rate(agentmesh_router_refusd_total[5m]) > 0", "unknown metric 'agentmesh_router_refusd_total'"),
        ('rate(agentmesh_router_refused_total{resource="memmory"}[5m]) > 0', "never takes the value 'memmory'"),
        ('rate(agentmesh_router_refused_total{reason="x"}[5m]) > 0', "has no label reason"),
        ('rate(agentmesh_router_goaway_sent_total{result=~"timeout|lost"}[5m]) > 0', "never takes the value 'lost'"),
        ("sum by (pood) (rate(agentmesh_router_refused_total[5m])) > 0", "groups by label 'pood'"),
        ('increase(agentmesh_runtime_stalls_total{cause="slow"}[5m]) > 0', "never takes the value 'slow'"),
        ("rate(agentmesh_router_refused_total[5m] > 0", "unbalanced"),
        ("rate(agentmesh_router_refused_total[5q]) > 0", "bad duration '5q'"),
        ("", "empty expression"),
    ],
)
def test_promql_check_catches(expr, expected):
    assert any(expected in p for p in promql_problems(expr)), promql_problems(expr)


def test_promql_check_accepts_subqueries_and_set_operators():
    expr = alert(render("monitoring"), "AgentmeshControlPlaneStorageGrowing")["expr"]
    assert "[12h:30m]" in expr and "unless on" in expr
    assert promql_problems(expr) == []


def test_rules_check_catches_a_missing_alert():
    objects = render("monitoring")
    for g in rules(objects):
        g["rules"] = [r for r in g["rules"] if "stalls" not in r["expr"]]
    assert "no alert reads agentmesh_runtime_stalls_total" in check_rules(objects)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("labels", {}, "severity must be one of"),
        ("annotations", {"summary": "x"}, "no description annotation"),
        ("annotations", {"summary": "x", "description": "y"}, "no runbook_url annotation"),
        (
            "annotations",
            {"summary": "x", "description": "y", "runbook_url": "deploy/k8s/README.md#agentmeshroutertrimmin"},
            "no such section in deploy/k8s/README.md",
        ),
        (
            "annotations",
            {"summary": "x", "description": "y", "runbook_url": "https://example.com/runbook"},
            "is not deploy/k8s/README.md#<section>",
        ),
        ("for", "ten minutes", "bad `for`"),
        ("alert", "router refusing", "is not AgentmeshCamelCase"),
        ("expression", "up == 0", "unknown fields ['expression']"),
    ],
)
def test_rules_check_catches_a_malformed_alert(field, value, expected):
    objects = render("monitoring")
    alert(objects, "AgentmeshRouterTrimming")[field] = value
    assert any(expected in p for p in check_rules(objects)), check_rules(objects)


def test_every_alert_has_a_runbook_section_that_says_what_to_do():
    anchors = readme_anchors()
    for g in rules(render("monitoring")):
        for r in g["rules"]:
            url = r["annotations"]["runbook_url"]
            assert url == f"deploy/k8s/README.md#{r['alert'].lower()}", url
            assert url.split("#")[1] in anchors


def test_monitors_check_catches_a_wrong_port():
    objects = render("overlays/production")
    pm = next(o for o in objects if o["kind"] == "PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["port"] = "p2p"
    assert any("agentmesh-router/router: no monitor scrapes" in p for p in check_monitors(objects))


def test_monitors_check_catches_a_selector_matching_nothing():
    objects = render("overlays/production")
    sm = next(o for o in objects if o["kind"] == "ServiceMonitor")
    sm["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "control-plane"}
    assert any("agentmesh-control-plane/control-plane: no monitor scrapes" in p for p in check_monitors(objects))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_rules(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules(render("monitoring"))}))
    out = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_listener_scraped_through_two_services_is_caught():
    """overlays/ha-postgres's headless Service carries only the gRPC port: with
    the HTTP port too, the ServiceMonitor would scrape every replica twice."""
    objects = render("overlays/ha-postgres")
    assert check_monitors(objects) == []
    name = "agentmesh-control-plane-headless"
    svc = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name)
    svc["spec"]["ports"].append({"name": "http", "port": 7401, "targetPort": "http", "protocol": "TCP"})
    assert any("is scraped 2 times" in p for p in check_monitors(objects)), check_monitors(objects)
