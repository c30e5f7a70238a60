"""Every kustomization renders; our renderer and `kubectl kustomize` agree."""

from __future__ import annotations

import os
import re
import textwrap

import pytest

import kustomize_lite
from conftest import HAVE_KUBECTL, K8S_DIR, OVERLAYS, kubectl_render, render


def by_id(objects):
    return {kustomize_lite.object_id(o): o for o in objects}


def test_overlays_for_dev_production_and_postgres_exist():
    assert {"overlays/dev", "overlays/production", "overlays/ha-postgres"} <= set(OVERLAYS)


def test_target_renders_named_objects(target):
    objects = render(target)
    assert objects, f"{target} rendered nothing"
    for o in objects:
        assert o.get("apiVersion") and o.get("kind") and o["metadata"].get("name")


def test_overlay_puts_everything_in_its_namespace(overlay):
    objects = render(overlay)
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    assert len(namespaces) == 1, "each overlay creates its namespace"
    ns = namespaces[0]["metadata"]["name"]
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == ns, f"{o['kind']}/{o['metadata']['name']}"


@pytest.mark.skipif(not HAVE_KUBECTL, reason="kubectl not installed: the Python renderer alone is used")
def test_kubectl_kustomize_renders_the_same_objects(target):
    ours = by_id(render(target))
    theirs = by_id(kubectl_render(os.path.join(K8S_DIR, target)))
    assert sorted(ours) == sorted(theirs)
    for oid, obj in ours.items():
        assert obj == theirs[oid], f"{oid} differs between kustomize_lite and kubectl kustomize"


def write_tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


BASE_POD = """
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: app}
    spec:
      selector: {matchLabels: {app: x}}
      template:
        metadata: {labels: {app: x}}
        spec:
          containers:
            - name: c
              image: img
              env:
                - {name: A, value: "1"}
                - {name: B, value: "2"}
                - {name: C, value: "$(A)"}
"""


def test_env_patch_puts_patched_items_first_like_kustomize(tmp_path):
    """The ordering rule that makes a partial env patch break $(VAR) references."""
    write_tree(
        tmp_path,
        {
            "base/kustomization.yaml": "resources: [app.yaml]\n",
            "base/app.yaml": BASE_POD,
            "o/kustomization.yaml": "resources: [../base]\npatches:\n  - path: p.yaml\n",
            "o/p.yaml": """
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: app}
            spec:
              template:
                spec:
                  containers:
                    - name: c
                      env:
                        - {name: C, value: "$(B)"}
        """,
        },
    )
    objects = kustomize_lite.render(str(tmp_path / "o"))
    env = objects[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["C", "A", "B"]
    assert env[0]["value"] == "$(B)"
    if HAVE_KUBECTL:
        assert kubectl_render(str(tmp_path / "o")) == objects


def test_namespace_labels_and_images_transform_like_kustomize(tmp_path):
    write_tree(
        tmp_path,
        {
            "kustomization.yaml": """
            namespace: ns1
            labels:
              - pairs: {team: mesh}
                includeSelectors: false
            images:
              - {name: img, newName: reg.example/img, newTag: "1.2"}
            resources: [app.yaml, ns.yaml]
        """,
            "app.yaml": BASE_POD,
            "ns.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: ns1}\n",
        },
    )
    objects = by_id(kustomize_lite.render(str(tmp_path)))
    app = objects[("apps", "Deployment", "ns1", "app")]
    assert app["metadata"]["labels"] == {"team": "mesh"}
    assert app["spec"]["selector"] == {"matchLabels": {"app": "x"}}
    assert app["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example/img:1.2"
    assert "namespace" not in objects[("", "Namespace", "", "ns1")]["metadata"]
    if HAVE_KUBECTL:
        assert by_id(kubectl_render(str(tmp_path))) == objects


@pytest.mark.parametrize(
    "kustomization, message",
    [
        ("resources: [app.yaml]\nconfigMapGenerator:\n  - name: x\n", "unsupported kustomization fields"),
        ("resources: [app.yaml]\nnamePrefix: x-\n", "unsupported kustomization fields"),
        ("resources: [missing.yaml]\n", "does not exist"),
        ("resources: [app.yaml, app.yaml]\n", "defined twice"),
        (
            "resources: [app.yaml]\npatches:\n  - path: p.yaml\n    target: {kind: Deployment}\n",
            "only `patches: - path",
        ),
        ("resources: [app.yaml]\npatches:\n  - path: other.yaml\n", "matches 0 objects"),
        ("resources: [app.yaml]\nlabels:\n  - pairs: {a: b}\n    includeSelectors: true\n", "not supported"),
    ],
)
def test_renderer_refuses_what_it_does_not_support(tmp_path, kustomization, message):
    write_tree(
        tmp_path,
        {
            "kustomization.yaml": kustomization,
            "app.yaml": BASE_POD,
            "p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: app}\nspec: {replicas: 2}\n",
            "other.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: nope}\nspec: {replicas: 2}\n",
        },
    )
    with pytest.raises(kustomize_lite.KustomizeError, match=message):
        kustomize_lite.render(str(tmp_path))


def test_renderer_refuses_a_document_that_is_not_an_object(tmp_path):
    write_tree(tmp_path, {"kustomization.yaml": "resources: [bad.yaml]\n", "bad.yaml": "just: a map\n"})
    with pytest.raises(kustomize_lite.KustomizeError, match="not a Kubernetes object"):
        kustomize_lite.render(str(tmp_path))


POD_WITH_CLAIM = """
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: app}
    spec:
      selector: {matchLabels: {app: x}}
      template:
        metadata: {labels: {app: x}}
        spec:
          containers:
            - name: c
              image: img
              volumeMounts:
                - {name: data, mountPath: /data}
                - {name: tmp, mountPath: /tmp}
          volumes:
            - {name: data, persistentVolumeClaim: {claimName: data}}
            - {name: tmp, emptyDir: {}}
    ---
    apiVersion: v1
    kind: PersistentVolumeClaim
    metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
"""

DELETE_CLAIM = """
    apiVersion: v1
    kind: PersistentVolumeClaim
    metadata: {name: data}
    $patch: delete
"""

DELETE_MOUNT = """
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: app}
    spec:
      template:
        spec:
          containers:
            - name: c
              volumeMounts:
                - {mountPath: /data, $patch: delete}
                - {name: key, mountPath: /key}
          volumes:
            - {name: data, $patch: delete}
            - {name: key, secret: {secretName: key}}
"""


def test_patch_delete_removes_objects_and_list_items_like_kustomize(tmp_path):
    """What overlays/ha-postgres does to base's SQLite claim and volume."""
    write_tree(
        tmp_path,
        {
            "base/kustomization.yaml": "resources: [app.yaml]\n",
            "base/app.yaml": POD_WITH_CLAIM,
            "o/kustomization.yaml": "resources: [../base]\npatches:\n  - path: mount.yaml\n  - path: claim.yaml\n",
            "o/mount.yaml": DELETE_MOUNT,
            "o/claim.yaml": DELETE_CLAIM,
        },
    )
    objects = kustomize_lite.render(str(tmp_path / "o"))
    assert [o["kind"] for o in objects] == ["Deployment"]
    spec = objects[0]["spec"]["template"]["spec"]
    assert [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]] == ["/key", "/tmp"]
    assert [v["name"] for v in spec["volumes"]] == ["key", "tmp"]
    if HAVE_KUBECTL:
        assert kubectl_render(str(tmp_path / "o")) == objects


@pytest.mark.parametrize(
    "patch, message",
    [
        # kustomize 5.5 crashes (nil pointer) on a file holding a delete beside another patch.
        (DELETE_CLAIM + "---\n" + DELETE_MOUNT, "must be alone in its patch file"),
        (DELETE_CLAIM.replace("delete", "replace"), "only `$patch: delete` of a whole object"),
        (DELETE_CLAIM.replace("$patch: delete", "$patch: delete\n    spec: {}"), "only `$patch: delete` of a whole"),
        (DELETE_MOUNT.replace("{name: data, $patch", "{name: data, emptyDir: {}, $patch"), "only `{name"),
        (DELETE_MOUNT.replace("{name: data, $patch", "{name: nope, $patch"), "deletes nothing"),
    ],
)
def test_renderer_refuses_deletes_it_does_not_support(tmp_path, patch, message):
    write_tree(
        tmp_path,
        {
            "kustomization.yaml": "resources: [app.yaml]\npatches:\n  - path: p.yaml\n",
            "app.yaml": POD_WITH_CLAIM,
            "p.yaml": patch,
        },
    )
    with pytest.raises(kustomize_lite.KustomizeError, match=re.escape(message)):
        kustomize_lite.render(str(tmp_path))
