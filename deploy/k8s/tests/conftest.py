"""Shared fixtures: where things are, which kustomizations exist, their renders."""

from __future__ import annotations

import copy
import functools
import glob
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)

import kustomize_lite  # noqa: E402

K8S_DIR = os.path.dirname(TESTS_DIR)
REPO_ROOT = os.path.dirname(os.path.dirname(K8S_DIR))

# The Kubernetes version every object is validated against (schemas shipped
# by the pinned kubernetes-validate, see requirements.txt).
KUBERNETES_VERSION = "1.33.0"

OVERLAYS = sorted(
    os.path.relpath(p, K8S_DIR) for p in glob.glob(os.path.join(K8S_DIR, "overlays", "*")) if os.path.isdir(p)
)
# Examples users copy (deploy/k8s/examples/*): rendered and checked as the
# overlays are.
EXAMPLES = sorted(
    os.path.relpath(p, K8S_DIR) for p in glob.glob(os.path.join(K8S_DIR, "examples", "*")) if os.path.isdir(p)
)
TARGETS = ["base", "monitoring", *OVERLAYS, *EXAMPLES]


@functools.lru_cache(maxsize=None)
def _render(target: str) -> tuple[Any, ...]:
    return tuple(kustomize_lite.render(os.path.join(K8S_DIR, target)))


def render(target: str) -> list[dict[str, Any]]:
    """The objects of one kustomization (a fresh copy the caller may mutate)."""
    return copy.deepcopy(list(_render(target)))


def kubectl_render(directory: str) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` as objects."""
    out = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise kustomize_lite.KustomizeError(f"kubectl kustomize {directory}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


HAVE_KUBECTL = shutil.which("kubectl") is not None


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return request.param
