"""The flags the manifests pass exist in the built programs (`--help`).

Uses binaries cargo already built (AGENTMESH_BIN_DIR, else target/debug, else
target/release); .ci/run builds them before this suite. A program not built
is skipped with the reason shown: these tests never run cargo."""

from __future__ import annotations

import pytest

import subprocess

from binaries import bin_dirs, find_binary, missing_flags
from checks import KNOWN_FLAGS
from conftest import EXAMPLES, OVERLAYS, TARGETS, render
from model import containers


def manifest_flags():
    """program (with subcommand) -> flags the rendered overlays and examples pass to it."""
    out: dict[str, set[str]] = {}
    for overlay in [*OVERLAYS, *EXAMPLES]:
        for c in containers(render(overlay)):
            if c.binary:
                key = c.binary + (f" {c.subcommand}" if c.subcommand else "")
                out.setdefault(key, set()).update(c.flags())
    return out


def test_manifests_only_use_known_flags():
    for program, flags in manifest_flags().items():
        assert flags <= KNOWN_FLAGS[program], (program, sorted(flags - KNOWN_FLAGS[program]))


@pytest.mark.parametrize("program", sorted(manifest_flags()))
def test_built_program_accepts_every_manifest_flag(program):
    binary_name, _, subcommand = program.partition(" ")
    binary = find_binary(binary_name)
    if binary is None:
        pytest.skip(f"{binary_name} is not built in {bin_dirs()}")
    missing = missing_flags(binary, subcommand or None, manifest_flags()[program])
    assert not missing, f"`{program} --help` does not list {missing}: the manifests would not start it"


@pytest.mark.parametrize("target_name", [t for t in TARGETS if t != "monitoring" and t not in EXAMPLES])
def test_the_policy_configmap_passes_policy_check(target_name, tmp_path):
    """The policy each kustomization applies at start passes the control
    plane's own checks (a refused one would stop it starting)."""
    binary = find_binary("agentmesh-control-plane")
    if binary is None:
        pytest.skip(f"agentmesh-control-plane is not built in {bin_dirs()}")
    cm = next(o for o in render(target_name) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "agentmesh-policy")
    path = tmp_path / "policy.toml"
    path.write_text(cm["data"]["policy.toml"])
    out = subprocess.run([binary, "policy", "check", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(cm["data"]["policy.toml"] + "\n[[grants]]\nfrom = [\"nobody\"]\nto = [\"x\"]\n")
    out = subprocess.run([binary, "policy", "check", str(bad)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and "unknown group" in out.stderr, out.stderr
