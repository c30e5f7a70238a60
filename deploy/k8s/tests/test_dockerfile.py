"""The Dockerfile (which cannot be built here: no Docker daemon) agrees with the
workspace and the manifests: multi-stage, non-root, minimal runtime."""

from __future__ import annotations

import os

import pytest

from conftest import OVERLAYS, REPO_ROOT, render
from dockerfile import dockerfile_problems, parse


def read(path):
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        return f.read()


def problems(text):
    return dockerfile_problems(text, REPO_ROOT, [render(o) for o in OVERLAYS])


def test_dockerfile_builds_and_ships_the_three_programs():
    assert problems(read("Dockerfile")) == []
    _, stages = parse(read("Dockerfile"))
    names = {os.path.basename(c.split()[-1]) for c in stages[-1].all("COPY")}
    assert names == {"agentmesh-control-plane", "agentmesh-router", "agentmesh-node"}


def test_dockerignore_keeps_build_output_and_git_out():
    lines = {line.strip() for line in read(".dockerignore").splitlines()}
    assert {"target", ".git"} <= lines


def test_cargo_lock_is_committed_for_locked_builds():
    assert os.path.isfile(os.path.join(REPO_ROOT, "Cargo.lock"))


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("USER 65532:65532", "USER root", "not a numeric non-root uid"),
        ("FROM gcr.io/distroless/cc-debian12:nonroot AS runtime", "FROM rust:1.95-bookworm AS runtime", "not minimal"),
        ("ARG RUST_VERSION=1.95", "ARG RUST_VERSION=1.80", "< workspace rust-version"),
        ("cargo build --release --locked", "cargo build --release", "does not `cargo build --release --locked`"),
        ("-p agentmesh-controlplane ", "", "does not build package agentmesh-controlplane"),
        ("/usr/local/bin/agentmesh-router\n", "/usr/local/bin/agentmesh-routr\n", "copies agentmesh-routr"),
        ("EXPOSE 4001 7400 7401 9090", "EXPOSE 4001", "port 9090 is not EXPOSEd"),
        ("agentmesh-router/pprof", "agentmesh-router/profiling", "has no feature profiling"),
        ("agentmesh-node/pprof", "agentmesh-routr/pprof", "not a workspace package"),
    ],
)
def test_dockerfile_check_catches(old, new, expected):
    text = read("Dockerfile")
    assert old in text
    found = problems(text.replace(old, new))
    assert any(expected in p for p in found), found


def test_single_stage_is_refused():
    assert problems("FROM rust:1.95-bookworm\nRUN cargo build --release --locked\n") == ["not multi-stage"]
