"""Policy checks pass on every kustomization, and catch each mistake they are for."""

from __future__ import annotations

import pytest

import checks
from conftest import TARGETS, render


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("check", sorted(checks.ALL_CHECKS))
def test_policy_holds(target_name, check):
    assert checks.ALL_CHECKS[check](render(target_name)) == []


def test_overlay_images_are_pinned(overlay):
    assert checks.check_images(render(overlay)) == []


def test_base_image_is_unpinned_and_caught():
    assert any("not pinned" in p for p in checks.check_images(render("base")))


# --- mutations: each breaks one rule on a copy of production -----------------


def get(objects, kind, name=None):
    return next(o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name))


def router(objects):
    return get(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def cp(objects):
    return get(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def router_pod(objects):
    return get(objects, "StatefulSet")["spec"]["template"]["spec"]


def set_arg(container, flag, value):
    container["args"] = [a for a in container["args"] if not a.startswith(flag + "=")] + [f"{flag}={value}"]


def cpu_limit(o):
    router(o)["resources"]["limits"]["cpu"] = "2"


def short_grace(o):
    router_pod(o)["terminationGracePeriodSeconds"] = 61


def small_memory(o):
    router(o)["resources"]["limits"]["memory"] = router(o)["resources"]["requests"]["memory"] = "1Gi"


def overcommit(o):
    router(o)["resources"]["requests"]["memory"] = "1Gi"


def low_watermark_75(o):
    get(o, "ConfigMap", "agentmesh-router-flags")["data"]["LOW_WATERMARK"] = "1875"


def misspelt_key(o):
    data = get(o, "ConfigMap", "agentmesh-router-flags")["data"]
    data["HIGH_WATERMAKR"] = data.pop("HIGH_WATERMARK")


def env_out_of_order(o):
    env = router(o)["env"]
    env.insert(0, env.pop(next(i for i, e in enumerate(env) if e["name"] == "EXTERNAL_ADDR")))


def literal_memory_flag(o):
    set_arg(router(o), "--memory-limit-bytes", "4831838208")


def extra_replica(o):
    get(o, "StatefulSet")["spec"]["replicas"] = 5


def no_pdb(o):
    o.remove(get(o, "PodDisruptionBudget"))


def other_url(o):
    set_arg(router(o), "--control-plane", "https://agentmesh-control-plane:7400")


def short_key_grace(o):
    get(o, "ConfigMap", "agentmesh-control-plane-flags")["data"]["KEY_GRACE_SECS"] = "3600"


def slow_leases(o):
    get(o, "ConfigMap", "agentmesh-router-flags")["data"]["LEASE_INTERVAL_SECS"] = "15"


def unknown_flag(o):
    router(o)["args"].append("--max-members=10")


def token_item_renamed(o):
    vol = next(v for v in router_pod(o)["volumes"] if v["name"] == "token")
    vol["secret"]["items"][0]["path"] = "router-token"


def key_on_tmpfs_readonly(o):
    set_arg(router(o), "--key-path", "/etc/agentmesh/token/router.key")


def metrics_open(o):
    get(o, "NetworkPolicy", "agentmesh-router")["spec"]["ingress"][0]["ports"].append({"port": 9090, "protocol": "TCP"})


def writable_root(o):
    router(o)["securityContext"]["readOnlyRootFilesystem"] = False


def as_root(o):
    router_pod(o)["securityContext"]["runAsUser"] = 0


def latest_image(o):
    cp(o)["image"] = "registry.example.com/agentmesh/agentmesh:latest"


def backup_other_db(o):
    job = get(o, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    job["args"] = ["backup", "--db=sqlite:///var/lib/agentmesh/other.db", "--to=/backup/x.db"]


def backup_anywhere(o):
    del get(o, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["affinity"]


def service_selects_nothing(o):
    get(o, "Service", "agentmesh-control-plane")["spec"]["selector"] = {"app.kubernetes.io/name": "agentmesh-cp"}


def readiness_on_healthz(o):
    router(o)["readinessProbe"]["httpGet"]["path"] = "/healthz"


def cp_two_replicas(o):
    get(o, "Deployment")["spec"]["replicas"] = 2


def missing_secret(o):
    router_pod(o)["volumes"][0]["secret"]["secretName"] = "agentmesh-router-tokens"


def bigger_fleet(o):
    get(o, "StatefulSet")["metadata"]["annotations"]["agentmesh/sized-for-members"] = "3500"


def slow_enrollment(o):
    get(o, "ConfigMap", "agentmesh-control-plane-flags")["data"]["ENROLL_RATE_PER_SEC"] = "10"


def unsized(o):
    del get(o, "StatefulSet")["metadata"]["annotations"]


def cp_short_grace(o):
    get(o, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 12


MUTATIONS = [
    (cp_short_grace, "terminationGracePeriodSeconds 12 < shutdown grace 10 + 5"),
    (bigger_fleet, "3500 x 2 / 3 = 2334 members per router > low watermark 2125"),
    (slow_enrollment, "a cold start of 3000 members needs"),
    (unsized, "must state the fleet"),
    (cpu_limit, "CPU limit"),
    (short_grace, "terminationGracePeriodSeconds 61 < drain grace 60"),
    (small_memory, "memory limit 1Gi <"),
    (overcommit, "memory request differs"),
    (low_watermark_75, "not 15% below"),
    (misspelt_key, "HIGH_WATERMAKR of ConfigMap agentmesh-router-flags is used by no flag"),
    (misspelt_key, "undefined $(HIGH_WATERMARK)"),
    (env_out_of_order, "uses $(POD_NAME) before it is defined"),
    (literal_memory_flag, "not the container's memory limit"),
    (extra_replica, "agentmesh-router-4 has no Service"),
    (no_pdb, "no PodDisruptionBudget"),
    (other_url, "proofs sign that URL"),
    (short_key_grace, "refuses to start"),
    (slow_leases, "lease interval 15s x 3 > lease TTL 30s"),
    (unknown_flag, "has no flag --max-members"),
    (token_item_renamed, "is not an item of volume token"),
    (key_on_tmpfs_readonly, "is written but its volume is not writable"),
    (metrics_open, "opens internal port 9090"),
    (writable_root, "root filesystem is writable"),
    (as_root, "runs as uid 0"),
    (latest_image, "not pinned"),
    (backup_other_db, "backs up sqlite:///var/lib/agentmesh/other.db"),
    (backup_anywhere, "no required affinity"),
    (service_selects_nothing, "matches no pod"),
    (readiness_on_healthz, "readinessProbe checks /healthz"),
    (cp_two_replicas, "single-replica Deployment"),
    (missing_secret, "Secret/agentmesh-router-tokens, neither rendered nor documented"),
]


@pytest.mark.parametrize("mutate, expected", MUTATIONS, ids=[f"{m.__name__}" for m, _ in MUTATIONS])
def test_policy_catches(mutate, expected):
    objects = render("overlays/production")
    mutate(objects)
    problems = [p for check in [*checks.ALL_CHECKS.values(), checks.check_images] for p in check(objects)]
    assert any(expected in p for p in problems), problems
