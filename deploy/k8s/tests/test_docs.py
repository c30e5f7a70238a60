"""deploy/k8s/README.md and docs/scalability.md say what the manifests do."""

from __future__ import annotations

import os
import re

import pytest

import checks
import sizing
from conftest import K8S_DIR, REPO_ROOT, render
from model import containers, parse_quantity


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
    """The numbers the docs give are the ones the checks (and the router) use."""
    assert sizing.IDLE_MEMBER_CHARGE_BYTES == 72 * 1024
    assert (sizing.MEMORY_BUDGET_PERCENT, sizing.HIGH_WATERMARK_MEMORY_PERCENT) == (75, 50)
    assert (sizing.RSS_BASE_BYTES, sizing.RSS_PER_MEMBER_BYTES) == (18 * sizing.MIB, 61 * 1024)
    for text in (readme(), scalability()):
        for needle in ("72 KiB", "64 KiB", "4 KiB", "18 MiB", "61 KiB", "1.5 × (18 MiB + high watermark × 61 KiB)"):
            assert needle in text, needle
        assert sizing.MEASURED_RUN in text
    assert "budget × 50% ÷ 72 KiB" in readme()
    assert "limit × 75% × 50% ÷ 72 KiB" in scalability()


@pytest.mark.parametrize(
    "row_name, target", [("dev", "overlays/dev"), ("base", "base"), ("production", "overlays/production")]
)
def test_readme_sizing_table_matches_the_manifests(row_name, target):
    row = re.search(
        rf"^\| {row_name} \| (\d+) \| (\S+) \| (\d+) / (\d+) \| (\d+) MiB \((\d+)\) \| (\d+) ",
        readme(),
        re.MULTILINE,
    )
    assert row, f"no sizing row for {row_name}"
    n, limit, high, low, rss, rss_headroom, fleet = row.groups()
    objects = render(target)
    router = next(c for c in containers(objects) if c.binary == "agentmesh-router")
    assert int(n) == router.workload["spec"]["replicas"]
    assert limit == router.spec["resources"]["limits"]["memory"]
    sz = sizing.router_sizing(int(parse_quantity(limit)), router.flag)
    assert (int(high), int(low)) == (sz.high, sz.low)
    assert int(rss) == round(sz.rss_at_high_bytes / sizing.MIB)
    assert int(rss_headroom) == round(sz.limit_needed_bytes / sizing.MIB)
    assert fleet == router.workload["metadata"]["annotations"][checks.FLEET_ANNOTATION]


def test_readme_lists_every_alert():
    rule = next(o for o in render("monitoring") if o["kind"] == "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    listed = set(re.findall(r"^\| (Agentmesh\w+) \|", readme(), re.MULTILINE))
    assert listed == alerts


# A run directory as the ladder names it: `results/<UTC stamp>-<name>`
# (hand-named runs), or `results/<UTC stamp to the second>` as
# `ladder/member-ladder.sh` names them now.
SOURCE = r"`results/(\d{8}T\d{4}Z-[\w.-]+|\d{8}T\d{6}Z)`|router/tests/|to be measured by the ladder \(issue 5\)"


def test_scalability_measurements_name_their_source():
    """Every row of the measured table cites a ladder run directory or a test,
    or says it is still to be measured; the release run is cited."""
    text = scalability()
    section = text[text.index("## Measured so far") :]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| quantity")]
    assert len(rows) >= 10
    for r in rows:
        value = r.rsplit(" | ", 1)[-1]
        assert re.search(SOURCE, value), r
    for run in set(re.findall(r"`results/([\w.-]+)`", section)):
        assert os.path.isdir(os.path.join(REPO_ROOT, "ladder", "results", run)), run
    assert f"`{sizing.MEASURED_RUN}`" in section
    assert "F × K / N" in text and "F × K / (N − 1)" in text
