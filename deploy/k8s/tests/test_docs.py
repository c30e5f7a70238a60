"""deploy/k8s/README.md and docs/scalability.md say what the manifests do."""

from __future__ import annotations

import os
import re

import pytest

import checks
from conftest import K8S_DIR, REPO_ROOT, render
from model import containers


def readme():
    with open(os.path.join(K8S_DIR, "README.md"), encoding="utf-8") as f:
        return f.read()


def scalability():
    with open(os.path.join(REPO_ROOT, "docs", "scalability.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_tells_how_to_create_every_external_object():
    text = readme()
    for kind, name in sorted(checks.EXTERNAL_OBJECTS):
        assert f"{kind} `{name}`" in text, f"README does not document {kind} {name}"


def test_readme_says_the_image_is_not_built_here():
    assert "no Docker daemon" in readme()


def test_sizing_constants_match_the_checks():
    for text in (readme(), scalability()):
        assert "256 MiB" in text and "256 KiB" in text and "64 KiB" in text and "896 KiB" in text
    assert checks.CHARGE_PER_MEMBER_BYTES == 896 * 1024
    assert checks.PROCESS_BASE_BYTES == 256 * checks.MIB


@pytest.mark.parametrize(
    "row_name, target", [("dev", "overlays/dev"), ("base", "base"), ("production", "overlays/production")]
)
def test_readme_sizing_table_matches_the_manifests(row_name, target):
    row = re.search(rf"^\| {row_name} \| (\d+) \| (\d+) / (\d+) \| [^|]+\| (\S+) \| (\d+) ", readme(), re.MULTILINE)
    assert row, f"no sizing row for {row_name}"
    n, high, low, limit, fleet = row.groups()
    objects = render(target)
    router = next(c for c in containers(objects) if c.binary == "agentmesh-router")
    assert int(n) == router.workload["spec"]["replicas"]
    assert (high, low) == (router.flag("--high-watermark"), router.flag("--low-watermark"))
    assert limit == router.spec["resources"]["limits"]["memory"]
    assert fleet == router.workload["metadata"]["annotations"][checks.FLEET_ANNOTATION]


def test_readme_lists_every_alert():
    rule = next(o for o in render("monitoring") if o["kind"] == "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    listed = set(re.findall(r"^\| (Agentmesh\w+) \|", readme(), re.MULTILINE))
    assert listed == alerts


def test_scalability_marks_what_the_ladder_must_measure():
    text = scalability()
    assert text.count("to be measured by the ladder (issue 5)") >= 5
    assert "F × K / N" in text and "F × K / (N − 1)" in text
