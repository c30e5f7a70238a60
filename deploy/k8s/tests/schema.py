"""Offline schema validation with kubernetes-validate, strict mode."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from kubernetes_validate import utils as kv_utils

from monitoring import is_monitoring


def schema_problems(objects: list[dict[str, Any]], version: str) -> list[str]:
    """Strict validation of every object against Kubernetes `version`.

    Only the prometheus-operator kinds may lack a schema (checked by
    monitoring.py instead); any other unknown kind is a problem, so a typo in
    a kind or apiVersion cannot pass as "no schema, skipped"."""
    problems = []
    for obj in objects:
        where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        if is_monitoring(obj):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kv_utils.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{where}: {path}: {e.message}")
        except kv_utils.SchemaNotFoundError as e:
            problems.append(f"{where}: {e.message}")
    return problems
