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


def short_drain(o):
    get(o, "ConfigMap", "agentmesh-router-flags")["data"]["DRAIN_GRACE_SECS"] = "30"


def small_memory(o):
    router(o)["resources"]["limits"]["memory"] = router(o)["resources"]["requests"]["memory"] = "1Gi"


def cheap_connections(o):
    set_arg(router(o), "--connection-charge-bytes", "16384")


def explicit_high_above_budget(o):
    set_arg(router(o), "--high-watermark", "12000")


def explicit_low(o):
    set_arg(router(o), "--low-watermark", "8000")


def few_reservations(o):
    set_arg(router(o), "--relay-max-reservations", "1000")


def overcommit(o):
    router(o)["resources"]["requests"]["memory"] = "1Gi"


def misspelt_key(o):
    data = get(o, "ConfigMap", "agentmesh-router-flags")["data"]
    data["DRAIN_GRACE_SEC"] = data.pop("DRAIN_GRACE_SECS")


def env_value(o, name, value):
    next(e for e in router(o)["env"] if e["name"] == name)["value"] = value


def dns_name_typo(o):
    annotations = get(o, "Service", "agentmesh-router-2")["metadata"]["annotations"]
    annotations["external-dns.alpha.kubernetes.io/hostname"] = "agentmesh-router-2.router.example.com"


def one_name_for_all(o):
    env_value(o, "EXTERNAL_ADDR", "/dns4/routers.example.com/tcp/4001")


def external_port_mismatch(o):
    env_value(o, "EXTERNAL_ADDR", "/dns4/$(POD_NAME).routers.example.com/tcp/4002")


def cluster_ip_behind_dns(o):
    get(o, "Service", "agentmesh-router-1")["spec"]["type"] = "ClusterIP"
    del get(o, "Service", "agentmesh-router-1")["spec"]["externalTrafficPolicy"]


def quic_listen_only(o):
    router(o)["args"].append("--listen=/ip4/0.0.0.0/udp/4001/quic-v1")


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
    get(o, "StatefulSet")["metadata"]["annotations"]["agentmesh/sized-for-members"] = "14000"


def slow_enrollment(o):
    get(o, "ConfigMap", "agentmesh-control-plane-flags")["data"]["ENROLL_RATE_PER_SEC"] = "10"


def unsized(o):
    del get(o, "StatefulSet")["metadata"]["annotations"]


def cp_short_grace(o):
    get(o, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 12


def no_policy(o):
    cp(o)["args"] = [a for a in cp(o)["args"] if not a.startswith("--policy=")]


def policy_key_renamed(o):
    data = get(o, "ConfigMap", "agentmesh-policy")["data"]
    data["policy.tml"] = data.pop("policy.toml")


MUTATIONS = [
    (cp_short_grace, "terminationGracePeriodSeconds 12 < shutdown grace 10 + 5"),
    (bigger_fleet, "14000 x 2 / 3 = 9334 members per router > low watermark 9283"),
    (slow_enrollment, "a cold start of 10000 members needs"),
    (unsized, "must state the fleet"),
    (cpu_limit, "CPU limit"),
    (short_grace, "terminationGracePeriodSeconds 61 < drain grace 60"),
    (short_drain, "drain grace 30s < 36s, the time to move 6667 members"),
    (small_memory, "10000 x 2 / 3 = 6667 members per router > low watermark 4641"),
    (cheap_connections, "idle member charge 24 KiB < measured RSS per member 61 KiB"),
    (cheap_connections, "memory limit 2Gi < 2955 MiB, the measured RSS at high watermark 32768"),
    (explicit_high_above_budget, "--high-watermark 12000 > 10922"),
    (explicit_low, "low watermark 8000 is not 15% below high 10922"),
    (few_reservations, "--relay-max-reservations 1000 < high watermark 10922"),
    (overcommit, "memory request differs"),
    (misspelt_key, "DRAIN_GRACE_SEC of ConfigMap agentmesh-router-flags is used by no flag"),
    (misspelt_key, "undefined $(DRAIN_GRACE_SECS)"),
    (dns_name_typo, "agentmesh-router-2 announces agentmesh-router-2.routers.example.com, but the Service publishes"),
    (one_name_for_all, "announces one name for all 4 pods"),
    (external_port_mismatch, "announces a transport and port the router does not listen on"),
    (external_port_mismatch, "listens on tcp port 4001 but announces no --external-addr"),
    (cluster_ip_behind_dns, "Service/agentmesh-router-1: agentmesh-router-1 announces the DNS name"),
    (quic_listen_only, "listens on quic-v1 port 4001 but announces no --external-addr for it"),
    (quic_listen_only, "has no UDP container port 4001"),
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
    (no_policy, "no --policy: a fresh database denies every call"),
    (policy_key_renamed, "is key policy.toml of ConfigMap agentmesh-policy, which does not hold it"),
]


@pytest.mark.parametrize("mutate, expected", MUTATIONS, ids=[f"{m.__name__}" for m, _ in MUTATIONS])
def test_policy_catches(mutate, expected):
    objects = render("overlays/production")
    mutate(objects)
    problems = [p for check in [*checks.ALL_CHECKS.values(), checks.check_images] for p in check(objects)]
    assert any(expected in p for p in problems), problems


def test_quic_announced_and_exposed_everywhere_passes():
    """The address check accepts QUIC done right (README, "Known gaps"): a UDP
    listener, its /dns4 .../udp/N/quic-v1 address, a UDP container port and a
    UDP port on every pod's Service. Without the Service ports it fails."""
    objects = render("overlays/production")
    c = router(objects)
    c["args"] += [
        "--listen=/ip4/0.0.0.0/udp/4001/quic-v1",
        "--external-addr=/dns4/$(POD_NAME).routers.example.com/udp/4001/quic-v1",
    ]
    c["ports"].append({"name": "p2p-quic", "containerPort": 4001, "protocol": "UDP"})
    problems = checks.check_router(objects)
    assert len(problems) == 4 and all("does not expose UDP port 4001" in p for p in problems), problems
    for i in range(4):
        svc = get(objects, "Service", f"agentmesh-router-{i}")
        svc["spec"]["ports"].append({"name": "p2p-quic", "port": 4001, "targetPort": "p2p-quic", "protocol": "UDP"})
    assert checks.check_router(objects) == []
