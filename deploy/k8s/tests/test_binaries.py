"""The flags the manifests pass exist in the built programs (`--help`).

Uses binaries cargo already built (AGENTMESH_BIN_DIR, else target/debug, else
target/release); .ci/run builds them before this suite. A program not built
is skipped with the reason shown: these tests never run cargo."""

from __future__ import annotations

import pytest

from binaries import bin_dirs, find_binary, missing_flags
from checks import KNOWN_FLAGS
from conftest import OVERLAYS, render
from model import containers


def manifest_flags():
    """program (with subcommand) -> flags the rendered overlays pass to it."""
    out: dict[str, set[str]] = {}
    for overlay in OVERLAYS:
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
