"""Every rendered object validates offline with kubernetes-validate --strict."""

from __future__ import annotations

import subprocess
import sys

import yaml

from conftest import KUBERNETES_VERSION, OVERLAYS, render
from schema import schema_problems


def test_every_object_validates_strictly(target):
    assert schema_problems(render(target), KUBERNETES_VERSION) == []


def run_cli(path):
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", KUBERNETES_VERSION, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_kubernetes_validate_cli_accepts_every_overlay(tmp_path):
    for overlay in OVERLAYS:
        path = tmp_path / (overlay.replace("/", "-") + ".yaml")
        path.write_text(yaml.safe_dump_all(render(overlay)))
        out = run_cli(path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "ERROR" not in out.stdout


def router_statefulset(objects):
    return next(o for o in objects if o["kind"] == "StatefulSet")


def test_strict_validation_rejects_an_unknown_field(tmp_path):
    objects = render("overlays/production")
    router_statefulset(objects)["spec"]["template"]["spec"]["containers"][0]["memoryLimit"] = "1Gi"
    problems = schema_problems(objects, KUBERNETES_VERSION)
    assert len(problems) == 1 and "memoryLimit" in problems[0]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    out = run_cli(path)
    assert out.returncode != 0 and "memoryLimit" in out.stdout


def test_strict_validation_rejects_a_wrong_type():
    objects = render("base")
    router_statefulset(objects)["spec"]["replicas"] = "three"
    problems = schema_problems(objects, KUBERNETES_VERSION)
    assert len(problems) == 1 and "replicas" in problems[0]


def test_a_misspelt_kind_is_a_problem_not_a_skip():
    objects = render("base")
    router_statefulset(objects)["kind"] = "StatefullSet"
    problems = schema_problems(objects, KUBERNETES_VERSION)
    assert len(problems) == 1 and "StatefullSet" in problems[0]
