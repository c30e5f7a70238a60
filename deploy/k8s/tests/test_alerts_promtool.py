"""Alert behaviour on synthetic series with `promtool test rules`: each alert
fires on the situation it is for, with its rendered summary and description,
and stays silent on a healthy look-alike. Runs where promtool is installed
(Debian package `prometheus`); the structural checks run everywhere."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from conftest import render

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)"
)

NS = 'namespace="agentmesh"'
R0 = f'{NS},pod="agentmesh-router-0"'
CP = f'{NS},pod="agentmesh-control-plane-7d9f"'

# alert -> (input series, eval time, labels of the expected alert or None when it must stay silent)
CASES = [
    (
        "AgentmeshRouterRefusing",
        {f'agentmesh_router_refused_total{{{R0},resource="stream",scope="protocol",protocol="catalog"}}': "0+120x40"},
        "25m",
        {
            "namespace": "agentmesh",
            "pod": "agentmesh-router-0",
            "resource": "stream",
            "scope": "protocol",
            "protocol": "catalog",
        },
    ),
    (
        "AgentmeshRouterRefusing",
        {f'agentmesh_router_refused_total{{{R0},resource="stream",scope="protocol",protocol="catalog"}}': "0+30x40"},
        "25m",
        None,
    ),
    (
        "AgentmeshRouterMemoryBudgetExhausted",
        {f'agentmesh_router_refused_total{{{R0},resource="memory",scope="system",protocol="call"}}': "0+6x30"},
        "20m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0"},
    ),
    (
        "AgentmeshRouterMemoryBudgetExhausted",
        {f'agentmesh_router_refused_total{{{R0},resource="stream",scope="peer",protocol="call"}}': "0+6x30"},
        "20m",
        None,
    ),
    (
        "AgentmeshRouterMemoryNearBudget",
        {
            f"agentmesh_router_memory_in_use_bytes{{{R0}}}": "950x30",
            f"agentmesh_router_memory_budget_bytes{{{R0}}}": "1000x30",
        },
        "20m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0"},
    ),
    (
        "AgentmeshRouterMemoryNearBudget",
        {
            f"agentmesh_router_memory_in_use_bytes{{{R0}}}": "500x30",
            f"agentmesh_router_memory_budget_bytes{{{R0}}}": "1000x30",
        },
        "20m",
        None,
    ),
    (
        "AgentmeshRouterTrimming",
        {f'agentmesh_router_trimmed_total{{{R0},reason="high_watermark"}}': "0 0 0 150 150 150 150 150 150"},
        "6m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0", "reason": "high_watermark"},
    ),
    ("AgentmeshRouterTrimming", {f'agentmesh_router_trimmed_total{{{R0},reason="high_watermark"}}': "0x8"}, "6m", None),
    (
        "AgentmeshRouterOverloaded",
        {f'agentmesh_router_goaway_sent_total{{{R0},reason="overloaded",result="acked"}}': "0+10x40"},
        "30m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0"},
    ),
    (
        "AgentmeshRouterOverloaded",
        {f'agentmesh_router_goaway_sent_total{{{R0},reason="draining",result="acked"}}': "0+10x40"},
        "30m",
        None,
    ),
    (
        "AgentmeshRouterGoAwayFailing",
        {f'agentmesh_router_goaway_sent_total{{{R0},reason="draining",result="timeout"}}': "0+60x30"},
        "20m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0", "reason": "draining", "result": "timeout"},
    ),
    (
        "AgentmeshRouterGoAwayFailing",
        {f'agentmesh_router_goaway_sent_total{{{R0},reason="draining",result="acked"}}': "0+60x30"},
        "20m",
        None,
    ),
    (
        "AgentmeshRouterNotReady",
        {f"agentmesh_router_ready{{{R0}}}": "0x20"},
        "15m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0"},
    ),
    ("AgentmeshRouterNotReady", {f"agentmesh_router_ready{{{R0}}}": "1x20"}, "15m", None),
    (
        "AgentmeshRouterDown",
        {f'up{{{R0},job="agentmesh/agentmesh-router"}}': "0x10"},
        "8m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0", "job": "agentmesh/agentmesh-router"},
    ),
    ("AgentmeshRouterDown", {f'up{{{CP},job="agentmesh-control-plane"}}': "0x10"}, "8m", None),
    (
        "AgentmeshRoutersDegraded",
        {
            f'kube_statefulset_status_replicas_ready{{{NS},statefulset="agentmesh-router"}}': "2x30",
            f'kube_statefulset_replicas{{{NS},statefulset="agentmesh-router"}}': "3x30",
        },
        "25m",
        {"namespace": "agentmesh", "statefulset": "agentmesh-router"},
    ),
    (
        "AgentmeshRoutersDegraded",
        {
            f'kube_statefulset_status_replicas_ready{{{NS},statefulset="agentmesh-router"}}': "3x30",
            f'kube_statefulset_replicas{{{NS},statefulset="agentmesh-router"}}': "3x30",
        },
        "25m",
        None,
    ),
    (
        "AgentmeshRouterLeaseFailing",
        {
            f'agentmesh_router_lease_total{{{R0},result="ok"}}': "0+1x10 10x20",
            f'agentmesh_router_lease_total{{{R0},result="error"}}': "0x10 0+1x20",
        },
        "25m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0"},
    ),
    (
        "AgentmeshRouterLeaseFailing",
        {
            f'agentmesh_router_lease_total{{{R0},result="ok"}}': "0+1x30",
            f'agentmesh_router_lease_total{{{R0},result="error"}}': "0x10 0+1x20",
        },
        "25m",
        None,
    ),
    (
        "AgentmeshRouterAuthRefusals",
        {f'agentmesh_router_auth_total{{{R0},purpose="attach",result="expired"}}': "0+120x40"},
        "30m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0", "result": "expired"},
    ),
    (
        "AgentmeshRouterAuthRefusals",
        {f'agentmesh_router_auth_total{{{R0},purpose="attach",result="admitted"}}': "0+120x40"},
        "30m",
        None,
    ),
    (
        "AgentmeshRuntimeStalls",
        {
            f'agentmesh_runtime_stalls_total{{{R0},cause="starved"}}': "0 0 0 1 1 1 1 1",
            f'agentmesh_runtime_stalls_total{{{R0},cause="busy"}}': "0x8",
            f'agentmesh_runtime_stalls_total{{{R0},cause="blocked"}}': "0x8",
        },
        "5m",
        {"namespace": "agentmesh", "pod": "agentmesh-router-0", "cause": "starved"},
    ),
    (
        "AgentmeshRuntimeStalls",
        {
            f'agentmesh_runtime_stalls_total{{{R0},cause="starved"}}': "0x8",
            f'agentmesh_runtime_stalls_total{{{R0},cause="busy"}}': "0x8",
            f'agentmesh_runtime_stalls_total{{{R0},cause="blocked"}}': "0x8",
        },
        "5m",
        None,
    ),
    (
        "AgentmeshKeyRotationOverdue",
        {f"agentmesh_control_plane_next_key_rotation_timestamp_seconds{{{CP}}}": "0x30"},
        "20m",
        {"namespace": "agentmesh", "pod": "agentmesh-control-plane-7d9f"},
    ),
    (
        "AgentmeshKeyRotationOverdue",
        {f"agentmesh_control_plane_next_key_rotation_timestamp_seconds{{{CP}}}": "100000x30"},
        "20m",
        None,
    ),
    (
        "AgentmeshControlPlaneStorageGrowing",
        {
            f'agentmesh_control_plane_storage_rows{{{CP},table="nodes"}}': "0+10x1000",
            f'agentmesh_control_plane_deleted_total{{{CP},table="nodes",reason="retention"}}': "0x1000",
        },
        "14h",
        {"namespace": "agentmesh", "table": "nodes"},
    ),
    (
        # Cluster-wide: the replica holding the reaper's duty counts the
        # rows, another deleted them while it held the duty earlier.
        "AgentmeshControlPlaneStorageGrowing",
        {
            f'agentmesh_control_plane_storage_rows{{{CP},table="nodes"}}': "0+10x1000",
            'agentmesh_control_plane_deleted_total{namespace="agentmesh",pod="agentmesh-control-plane-other",'
            'table="nodes",reason="retention"}': "0+1x1000",
        },
        "14h",
        None,
    ),
    (
        "AgentmeshControlPlaneStorageGrowing",
        {
            f'agentmesh_control_plane_storage_rows{{{CP},table="nodes"}}': "0+10x1000",
            f'agentmesh_control_plane_deleted_total{{{CP},table="nodes",reason="retention"}}': "0+1x1000",
        },
        "14h",
        None,
    ),
    (
        "AgentmeshEnrollmentThrottled",
        {f'agentmesh_control_plane_limiter_refusals_total{{{CP},limiter="enroll"}}': "0+100x40"},
        "25m",
        {"namespace": "agentmesh", "pod": "agentmesh-control-plane-7d9f"},
    ),
    (
        "AgentmeshEnrollmentThrottled",
        {f'agentmesh_control_plane_limiter_refusals_total{{{CP},limiter="failure_guard"}}': "0+100x40"},
        "25m",
        None,
    ),
    (
        "AgentmeshControlPlaneDatabaseBusy",
        {f'agentmesh_control_plane_limiter_refusals_total{{{CP},limiter="db_busy"}}': "0+5x30"},
        "20m",
        {"namespace": "agentmesh", "pod": "agentmesh-control-plane-7d9f"},
    ),
    (
        "AgentmeshControlPlaneDatabaseBusy",
        {f'agentmesh_control_plane_limiter_refusals_total{{{CP},limiter="db_busy"}}': "5x30"},
        "20m",
        None,
    ),
    (
        "AgentmeshControlPlaneDown",
        {f'up{{{CP},job="agentmesh-control-plane"}}': "0x10"},
        "8m",
        {"namespace": "agentmesh", "pod": "agentmesh-control-plane-7d9f", "job": "agentmesh-control-plane"},
    ),
    ("AgentmeshControlPlaneDown", {f'up{{{CP},job="agentmesh-control-plane"}}': "1x10"}, "8m", None),
]


def groups():
    return next(o for o in render("monitoring") if o["kind"] == "PrometheusRule")["spec"]["groups"]


def rule(name):
    return next(r for g in groups() for r in g["rules"] if r["alert"] == name)


def expand(template, labels):
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], template)


def test_every_alert_has_a_firing_case():
    alerts = {r["alert"] for g in groups() for r in g["rules"]}
    assert alerts == {name for name, _, _, labels in CASES if labels is not None}


@pytest.mark.parametrize(
    "name, series, at, labels", CASES, ids=[f"{c[0]}-{'fires' if c[3] else 'silent'}" for c in CASES]
)
def test_alert(tmp_path, name, series, at, labels):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups()}))
    expected = []
    if labels is not None:
        r = rule(name)
        expected = [
            {
                "exp_labels": {**labels, **r["labels"]},
                "exp_annotations": {k: expand(v, labels) for k, v in r["annotations"].items()},
            }
        ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    out = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
