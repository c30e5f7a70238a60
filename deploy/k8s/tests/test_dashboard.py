"""The Grafana dashboard: well formed, every query parsed by promtool, and
every metric and label it reads served by the programs themselves
(agentmesh-one's control plane and routers and a member, scraped live)."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess

import pytest

from binaries import bin_dirs, find_binary
from dashboard import load, parse_exposition, promtool_rules, queries, served_problems, structure_problems
from sandbox import free_port, http_get, wait_until


def test_dashboard_is_well_formed():
    d = load()
    assert structure_problems(d) == []
    titles = " ".join(p.get("title", "") for p in d["panels"])
    for part in ("Control plane", "Routers", "Members"):
        assert part in titles


def test_structure_check_catches_an_unknown_variable():
    d = load()
    next(p for p in d["panels"] if p.get("targets"))["targets"][0]["expr"] = "sum(agentmesh_router_ready{pod=~\"$pods\"})"
    assert any("a variable the checks do not know" in p for p in structure_problems(d))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_parses_every_query(tmp_path):
    path = tmp_path / "dashboard-rules.json"
    # promtool reads YAML; JSON is YAML.
    path.write_text(promtool_rules(load()))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(queries(load()))} rules found" in out.stdout, out.stdout


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_catches_a_broken_query(tmp_path):
    d = load()
    next(p for p in d["panels"] if p.get("targets"))["targets"][0]["expr"] = "sum by (pod (agentmesh_router_ready)"
    path = tmp_path / "broken.json"
    path.write_text(promtool_rules(d))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_served_check_catches_a_renamed_metric_and_a_wrong_label():
    d = load()
    served = {
        "agentmesh_router_ready": set(),
        "agentmesh_router_refused_total": {"resource", "scope", "protocol"},
    }
    panel = next(p for p in d["panels"] if p.get("targets"))
    panel["targets"] = [
        {"refId": "A", "expr": "sum(agentmesh_router_readyy)"},
        {"refId": "B", "expr": "sum by (reason) (rate(agentmesh_router_refused_total[5m]))"},
    ]
    d["panels"] = [panel]
    problems = served_problems(d, served)
    assert any("agentmesh_router_readyy is served by no program" in p for p in problems), problems
    assert any("label 'reason' is on none of" in p for p in problems), problems


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """What agentmesh-one (control plane, two routers) and a member serve."""
    one, node = find_binary("agentmesh-one"), find_binary("agentmesh-node")
    if one is None or node is None:
        pytest.skip(f"agentmesh-one and agentmesh-node are not built in {bin_dirs()}")
    root = tmp_path_factory.mktemp("dashboard")
    grpc, http, member = free_port(), free_port(), free_port()
    env = {**os.environ, "RUST_LOG": "warn"}
    procs = []
    try:
        with open(root / "one.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [one, "--data-dir", str(root / "one"), "--grpc-addr", f"127.0.0.1:{grpc}",
                     "--http-addr", f"127.0.0.1:{http}", "--router-base-port", "0", "--router-metrics-base-port", "0"],
                    stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                )
            )
        banner = []
        for line in procs[0].stdout:
            banner.append(line)
            if line.startswith("join with"):
                break
        router_ports = [int(p) for p in re.findall(r"metrics http://127\.0\.0\.1:(\d+)/metrics", "".join(banner))]
        assert len(router_ports) == 2, banner
        with open(root / "node.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [node, "run", "--control-plane", f"http://127.0.0.1:{grpc}", "--token-file",
                     str(root / "one" / "token"), "--data-dir", str(root / "member"),
                     "--metrics-addr", f"127.0.0.1:{member}", "--expose", "echo=127.0.0.1:9"],
                    stdout=log, stderr=subprocess.STDOUT, env=env,
                )
            )
        ready = wait_until(lambda: (http_get(member, "/readyz") or (0, ""))[0] == 200, 30, procs[1])
        assert ready, (root / "node.log").read_text()
        out: dict[str, set[str]] = {}
        for port in [http, *router_ports, member]:
            got = http_get(port, "/metrics")
            assert got and got[0] == 200, (port, got)
            for name, labels in parse_exposition(got[1]).items():
                out.setdefault(name, set()).update(labels)
        yield out
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_every_query_reads_metrics_and_labels_the_programs_serve(served):
    assert served_problems(copy.deepcopy(load()), served) == []
