"""A small, strict renderer for the subset of kustomize that deploy/k8s uses.

It exists so the manifests can be rendered and validated on a machine that has
only python3 + pip. When kubectl is installed, the tests also render with
`kubectl kustomize` and require both renderings to be identical, so this file
cannot silently drift from real kustomize.

Supported kustomization fields (anything else is an error, never ignored):
  apiVersion, kind, resources (files with one or more documents, or
  directories holding a kustomization), namespace, labels (pairs with
  includeSelectors: false; labels go to metadata.labels only), images (name,
  newName, newTag, digest) and patches given by `path` holding strategic-merge
  patches that name their target by kind and metadata.name. One directive:
  `$patch: delete`, on a whole object (alone in its patch file: kustomize
  5.5 crashes on a file holding it beside other patches) or on an item of a
  keyed list (the item names only its merge key).

Transformers run in kustomize's order: patches, namespace, labels, images.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}

# Kinds that have no namespace (the subset we could plausibly meet).
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "PriorityClass",
    "StorageClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}

# Strategic-merge merge keys of the list fields we patch, by field name, as in
# the Kubernetes API's patchMergeKey tags. Lists not named here are replaced.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}


class KustomizeError(Exception):
    """The kustomization uses something this renderer does not support, or is broken."""


def find_kustomization(directory: str) -> str:
    """Returns the path of the kustomization file in `directory`."""
    for name in KUSTOMIZATION_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise KustomizeError(f"no kustomization file in {directory}")


def load_documents(path: str) -> list[dict[str, Any]]:
    """Loads every non-empty YAML document of `path`; each must be a Kubernetes object."""
    with open(path, encoding="utf-8") as f:
        try:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            raise KustomizeError(f"{path}: invalid YAML: {e}") from e
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            raise KustomizeError(f"{path}: a document is not a Kubernetes object (kind, metadata)")
        if not d["metadata"].get("name"):
            raise KustomizeError(f"{path}: a {d['kind']} has no metadata.name")
    return docs


def object_id(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name): what kustomize treats as an object's identity."""
    api = obj.get("apiVersion", "")
    group = api.split("/")[0] if "/" in api else ""
    meta = obj.get("metadata", {})
    return (group, obj["kind"], meta.get("namespace", "") or "", meta["name"])


def render(directory: str) -> list[dict[str, Any]]:
    """Renders the kustomization in `directory` to a list of objects."""
    path = find_kustomization(directory)
    with open(path, encoding="utf-8") as f:
        k = yaml.safe_load(f) or {}
    if not isinstance(k, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unknown = set(k) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: unsupported kustomization fields {sorted(unknown)}")
    if k.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{path}: kind must be Kustomization")

    objects: list[dict[str, Any]] = []
    for res in k.get("resources", []) or []:
        res_path = os.path.normpath(os.path.join(directory, res))
        if os.path.isdir(res_path):
            objects.extend(render(res_path))
        elif os.path.isfile(res_path):
            objects.extend(load_documents(res_path))
        else:
            raise KustomizeError(f"{path}: resource {res} does not exist")
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        oid = object_id(obj)
        if oid in seen:
            raise KustomizeError(f"{path}: {oid} is defined twice")
        seen.add(oid)

    for patch in k.get("patches", []) or []:
        apply_patch_entry(objects, directory, path, patch)
    if k.get("namespace"):
        apply_namespace(objects, k["namespace"])
    for entry in k.get("labels", []) or []:
        apply_labels(objects, path, entry)
    for image in k.get("images", []) or []:
        apply_image(objects, path, image)
    return objects


def apply_patch_entry(objects: list[dict[str, Any]], directory: str, kpath: str, entry: Any) -> None:
    """Applies one `patches:` entry (a path to strategic-merge patches)."""
    if not isinstance(entry, dict) or set(entry) != {"path"}:
        raise KustomizeError(f"{kpath}: only `patches: - path: FILE` is supported, got {entry!r}")
    ppath = os.path.join(directory, entry["path"])
    if not os.path.isfile(ppath):
        raise KustomizeError(f"{kpath}: patch {entry['path']} does not exist")
    patches = load_documents(ppath)
    for patch in patches:
        targets = [
            o
            for o in objects
            if o["kind"] == patch["kind"]
            and o["metadata"]["name"] == patch["metadata"]["name"]
            and o.get("apiVersion") == patch.get("apiVersion")
        ]
        if len(targets) != 1:
            raise KustomizeError(
                f"{ppath}: patch for {patch['kind']}/{patch['metadata']['name']} matches {len(targets)} objects"
            )
        if "$patch" in patch:
            if patch["$patch"] != "delete" or set(patch) != {"apiVersion", "kind", "metadata", "$patch"}:
                raise KustomizeError(f"{ppath}: only `$patch: delete` of a whole object (nothing else) is supported")
            if len(patches) > 1:
                raise KustomizeError(
                    f"{ppath}: `$patch: delete` must be alone in its patch file (kustomize 5.5 crashes otherwise)"
                )
            objects.remove(targets[0])
            continue
        body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}
        merged = strategic_merge(targets[0], body, [])
        targets[0].clear()
        targets[0].update(merged)


def strategic_merge(orig: Any, patch: Any, path: list[str]) -> Any:
    """Merges `patch` into a copy of `orig` with strategic-merge-patch rules."""
    if isinstance(patch, dict) and isinstance(orig, dict):
        out = copy.deepcopy(orig)
        for key, value in patch.items():
            if key.startswith("$"):
                raise KustomizeError(f"patch directive {key} at {'.'.join(path)} is not supported")
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, path + [key])
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(patch, list) and isinstance(orig, list) and path and path[-1] in MERGE_KEYS:
        return merge_list(orig, patch, MERGE_KEYS[path[-1]], path)
    return copy.deepcopy(patch)


def merge_list(orig: list[Any], patch: list[Any], key: str, path: list[str]) -> list[Any]:
    """Merges a keyed list as kustomize does: patched items first, in patch order."""
    out: list[Any] = []
    used: set[Any] = set()
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise KustomizeError(f"list {'.'.join(path)}: patch item without merge key {key}")
        match = [o for o in orig if isinstance(o, dict) and o.get(key) == item[key]]
        used.add(item[key])
        if "$patch" in item:
            if item["$patch"] != "delete" or set(item) != {key, "$patch"}:
                raise KustomizeError(
                    f"list {'.'.join(path)}: only `{{{key}: ..., $patch: delete}}` is supported, got {item!r}"
                )
            if not match:
                raise KustomizeError(f"list {'.'.join(path)}: `$patch: delete` of {item[key]!r} deletes nothing")
            continue
        out.append(strategic_merge(match[0], item, path) if match else copy.deepcopy(item))
    out.extend(copy.deepcopy(o) for o in orig if not (isinstance(o, dict) and o.get(key) in used))
    return out


def apply_namespace(objects: list[dict[str, Any]], namespace: str) -> None:
    """Sets metadata.namespace on every namespaced object."""
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED_KINDS:
            obj["metadata"]["namespace"] = namespace


def apply_labels(objects: list[dict[str, Any]], kpath: str, entry: Any) -> None:
    """Adds `labels[].pairs` to metadata.labels (selectors and templates untouched)."""
    if not isinstance(entry, dict) or set(entry) - {"pairs", "includeSelectors", "includeTemplates"}:
        raise KustomizeError(f"{kpath}: unsupported labels entry {entry!r}")
    if entry.get("includeSelectors", False) or entry.get("includeTemplates", False):
        raise KustomizeError(f"{kpath}: labels with includeSelectors/includeTemplates are not supported")
    for obj in objects:
        labels = obj["metadata"].setdefault("labels", {})
        labels.update({str(k): str(v) for k, v in entry.get("pairs", {}).items()})


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """Splits `name[:tag][@digest]` into its parts."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    tag = None
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        image, tag = image.rsplit(":", 1)
    return image, tag, digest


def apply_image(objects: list[dict[str, Any]], kpath: str, entry: Any) -> None:
    """Rewrites container images named `entry['name']`."""
    if not isinstance(entry, dict) or "name" not in entry or set(entry) - {"name", "newName", "newTag", "digest"}:
        raise KustomizeError(f"{kpath}: unsupported images entry {entry!r}")

    def rewrite(image: str) -> str:
        name, tag, digest = split_image(image)
        if name != entry["name"]:
            return image
        name = entry.get("newName", name)
        if "digest" in entry:
            return f"{name}@{entry['digest']}"
        if "newTag" in entry:
            return f"{name}:{entry['newTag']}"
        return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for field in ("containers", "initContainers"):
                for c in node.get(field, []) or []:
                    if isinstance(c, dict) and isinstance(c.get("image"), str):
                        c["image"] = rewrite(c["image"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(objects)
