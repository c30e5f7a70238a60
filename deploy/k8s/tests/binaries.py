"""Finding the programs cargo built, and asking them for their flags.

These tests never run cargo: they use what CI (or a developer) already built."""

from __future__ import annotations

import os
import subprocess

from conftest import REPO_ROOT


def bin_dirs() -> list[str]:
    """AGENTMESH_BIN_DIR, else CARGO_TARGET_DIR (or ./target) /debug and /release."""
    env = os.environ.get("AGENTMESH_BIN_DIR")
    if env:
        return [env]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO_ROOT, "target"))
    return [os.path.join(target, "debug"), os.path.join(target, "release")]


def find_binary(name: str) -> str | None:
    """Path of a built program, or None."""
    for d in bin_dirs():
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def help_text(binary: str, subcommand: str | None) -> str:
    """`binary [subcommand] --help`."""
    cmd = [binary] + (subcommand.split() if subcommand else []) + ["--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr}")
    return out.stdout


def missing_flags(binary: str, subcommand: str | None, flags: set[str]) -> list[str]:
    """The flags `--help` does not list."""
    text = help_text(binary, subcommand)
    return sorted(f for f in flags if not any(f + sep in text for sep in (" ", "=", "\n", "<", ",")))
