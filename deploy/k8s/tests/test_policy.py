"""Policy checks pass on every kustomization, and catch each mistake they are for."""

from __future__ import annotations

import pytest

import checks
from conftest import OVERLAYS, TARGETS, render
from model import containers, store_kind


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


# --- the shape each store needs -----------------------------------------------


def test_the_overlays_cover_both_stores():
    def store(overlay):
        return store_kind(next(c for c in containers(render(overlay)) if c.binary == "agentmesh-control-plane"))

    stores = {o: store(o) for o in OVERLAYS}
    assert stores["overlays/dev"] == stores["overlays/production"] == "sqlite"
    assert stores["overlays/ha-postgres"] == "postgres"


def cp_three_replicas(o):
    get(o, "Deployment")["spec"]["replicas"] = 3


def sqlite_on_empty_dir(o):
    pod = get(o, "Deployment")["spec"]["template"]["spec"]
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    del data["persistentVolumeClaim"]
    data["emptyDir"] = {}


SQLITE_MUTATIONS = [
    (cp_three_replicas, "SQLite needs a single-replica Deployment with strategy Recreate"),
    (sqlite_on_empty_dir, "SQLite file /var/lib/agentmesh/controlplane.db is not on a rendered PersistentVolumeClaim"),
]


@pytest.mark.parametrize("mutate, expected", SQLITE_MUTATIONS, ids=[m.__name__ for m, _ in SQLITE_MUTATIONS])
def test_sqlite_rules_catch(mutate, expected):
    objects = render("overlays/production")
    mutate(objects)
    problems = [p for check in checks.ALL_CHECKS.values() for p in check(objects)]
    assert any(expected in p for p in problems), problems


# Each breaks one rule of several replicas on PostgreSQL, on a copy of
# overlays/ha-postgres.


def cp_pod(o):
    return get(o, "Deployment")["spec"]["template"]["spec"]


def env_item(o, name):
    return next(e for e in cp(o)["env"] if e["name"] == name)


def back_on_sqlite(o):
    set_arg(cp(o), "--db", "sqlite:///tmp/controlplane.db")


def one_replica(o):
    get(o, "Deployment")["spec"]["replicas"] = 1


def max_unavailable_one(o):
    get(o, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = 1


def default_rolling(o):
    del get(o, "Deployment")["spec"]["strategy"]["rollingUpdate"]


def recreate(o):
    get(o, "Deployment")["spec"]["strategy"] = {"type": "Recreate"}


def as_statefulset(o):
    get(o, "Deployment")["kind"] = "StatefulSet"


def no_cp_pdb(o):
    o.remove(get(o, "PodDisruptionBudget", "agentmesh-control-plane"))


def pdb_blocks_drains(o):
    spec = get(o, "PodDisruptionBudget", "agentmesh-control-plane")["spec"]
    del spec["maxUnavailable"]
    spec["minAvailable"] = 3


def pdb_lets_all_go(o):
    get(o, "PodDisruptionBudget", "agentmesh-control-plane")["spec"]["maxUnavailable"] = 3


def pdb_percent(o):
    get(o, "PodDisruptionBudget", "agentmesh-control-plane")["spec"]["maxUnavailable"] = "34%"


def no_anti_affinity(o):
    del cp_pod(o)["affinity"]


def anti_affinity_per_zone(o):
    term = cp_pod(o)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    term["podAffinityTerm"]["topologyKey"] = "topology.kubernetes.io/zone"


def no_pre_stop(o):
    del cp(o)["lifecycle"]


def pre_stop_beyond_grace(o):
    cp(o)["lifecycle"]["preStop"]["sleep"]["seconds"] = 20


def dsn_literal_arg(o):
    set_arg(cp(o), "--db", "postgres://agentmesh:hunter2@db.internal:5432/agentmesh")


def dsn_in_configmap(o):
    get(o, "ConfigMap", "agentmesh-control-plane-flags")["data"]["DATABASE_URL"] = "postgresql://agentmesh@db/agentmesh"
    set_arg(cp(o), "--db", "$(DATABASE_URL)")


def dsn_env_literal(o):
    env_item(o, "AGENTMESH_DB_URL").update({"value": "postgres://agentmesh@db.internal/agentmesh"})
    del env_item(o, "AGENTMESH_DB_URL")["valueFrom"]


def password_literal(o):
    env_item(o, "PGPASSWORD").update({"value": "hunter2"})
    del env_item(o, "PGPASSWORD")["valueFrom"]


def no_kek(o):
    cp(o)["args"] = [a for a in cp(o)["args"] if not a.startswith("--key-encryption-key-file=")]


def kek_on_configmap(o):
    vol = next(v for v in cp_pod(o)["volumes"] if v["name"] == "key-encryption-key")
    vol["configMap"] = {"name": "agentmesh-policy", "items": [{"key": "policy.toml", "path": "key"}]}
    del vol["secret"]


def kek_env_literal(o):
    no_kek(o)
    cp(o)["env"].append({"name": "AGENTMESH_KEY_ENCRYPTION_KEY", "value": "00" * 32})


def data_claim_kept(o):
    cp_pod(o)["volumes"].append(
        {"name": "data", "persistentVolumeClaim": {"claimName": "agentmesh-control-plane-data"}}
    )
    cp(o)["volumeMounts"].append({"name": "data", "mountPath": "/var/lib/agentmesh"})


def backup_job_kept(o):
    o.append(get(render("overlays/production"), "CronJob"))


def orphan_claim(o):
    o.append(get(render("overlays/production"), "PersistentVolumeClaim", "agentmesh-control-plane-data"))


def no_headless(o):
    o.remove(get(o, "Service", "agentmesh-control-plane-headless"))


def headless_not_ready(o):
    get(o, "Service", "agentmesh-control-plane-headless")["spec"]["publishNotReadyAddresses"] = True


def headless_http_only(o):
    get(o, "Service", "agentmesh-control-plane-headless")["spec"]["ports"] = [
        {"name": "http", "port": 7401, "targetPort": "http", "protocol": "TCP"}
    ]


def url_on_headless(o):
    url = "https://agentmesh-control-plane-headless.agentmesh.svc:7400"
    get(o, "ConfigMap", "agentmesh-shared")["data"]["CONTROL_PLANE_URL"] = url


def url_nowhere(o):
    get(o, "ConfigMap", "agentmesh-shared")["data"]["CONTROL_PLANE_URL"] = "https://cp.example.org:7400"


def url_wrong_port(o):
    get(o, "ConfigMap", "agentmesh-shared")["data"]["CONTROL_PLANE_URL"] = "https://mesh.example.com"


def routers_through_balancing_only(o):
    router(o)["args"] = [a for a in router(o)["args"] if not a.startswith("--control-plane-endpoint=")]


def routers_endpoint_not_headless(o):
    set_arg(router(o), "--control-plane-endpoint", "dns+https://agentmesh-control-plane:7400")


def routers_endpoint_wrong_port(o):
    set_arg(router(o), "--control-plane-endpoint", "dns+https://agentmesh-control-plane-headless:7401")


def routers_endpoint_plain_http(o):
    set_arg(router(o), "--control-plane-endpoint", "dns+http://agentmesh-control-plane-headless:7400")


def undocumented_db_secret(o):
    env_item(o, "AGENTMESH_DB_URL")["valueFrom"]["secretKeyRef"]["name"] = "agentmesh-db"


POSTGRES_MUTATIONS = [
    (back_on_sqlite, "SQLite needs a single-replica Deployment with strategy Recreate"),
    (one_replica, "1 replica on PostgreSQL: run at least 2"),
    (max_unavailable_one, "rollingUpdate.maxUnavailable 1, should be 0"),
    (default_rolling, "rollingUpdate.maxUnavailable 25% (default), should be 0"),
    (recreate, "strategy Recreate: replicas on PostgreSQL roll"),
    (as_statefulset, "run them as a Deployment, not a StatefulSet"),
    (no_cp_pdb, "no PodDisruptionBudget: a node drain may evict every replica at once"),
    (pdb_blocks_drains, "allows no eviction of 3 replicas"),
    (pdb_lets_all_go, "lets every one of 3 replicas be evicted at once"),
    (pdb_percent, "give a number of replicas, not '34%'"),
    (no_anti_affinity, "no pod anti-affinity"),
    (anti_affinity_per_zone, "no pod anti-affinity"),
    (no_pre_stop, "no preStop hook"),
    (pre_stop_beyond_grace, "terminationGracePeriodSeconds 30 < preStop 20 + shutdown grace 10 + 5"),
    (dsn_literal_arg, "is a literal PostgreSQL URL"),
    (dsn_literal_arg, "--db is not $(VAR) of an env item from a Secret"),
    (dsn_in_configmap, "key DATABASE_URL holds a PostgreSQL URL"),
    (dsn_in_configmap, "--db is not $(VAR) of an env item from a Secret"),
    (dsn_env_literal, "env AGENTMESH_DB_URL is a literal PostgreSQL URL"),
    (password_literal, "env PGPASSWORD is a literal"),
    (no_kek, "no key-encryption key"),
    (kek_on_configmap, "--key-encryption-key-file /etc/agentmesh/key-encryption-key/key is not on a Secret volume"),
    (kek_env_literal, "env AGENTMESH_KEY_ENCRYPTION_KEY is a literal"),
    (data_claim_kept, "mounts claim agentmesh-control-plane-data: the state is in PostgreSQL"),
    (backup_job_kept, "a SQLite backup job, but the control plane runs on PostgreSQL"),
    (orphan_claim, "PersistentVolumeClaim/agentmesh-control-plane-data: mounted by no workload"),
    (no_headless, "no headless Service over the replicas"),
    (headless_not_ready, "publishes replicas that are not ready"),
    (headless_http_only, "no port to the gRPC port 7400"),
    (url_on_headless, "is the headless Service agentmesh-control-plane-headless"),
    (url_nowhere, "--public-url host cp.example.org is no Service over the control plane"),
    (url_wrong_port, "no port 443 to the gRPC port 7400"),
    (routers_through_balancing_only, "no --control-plane-endpoint=dns+https://<headless Service>:<port>"),
    (routers_endpoint_not_headless, "--control-plane-endpoint host agentmesh-control-plane is no headless Service"),
    (routers_endpoint_wrong_port, "--control-plane-endpoint port 7401 does not reach the gRPC port 7400"),
    (routers_endpoint_plain_http, "--control-plane-endpoint is http, --control-plane https"),
    (undocumented_db_secret, "env AGENTMESH_DB_URL needs Secret/agentmesh-db, neither rendered nor documented"),
]


@pytest.mark.parametrize("mutate, expected", POSTGRES_MUTATIONS, ids=[m.__name__ for m, _ in POSTGRES_MUTATIONS])
def test_postgres_rules_catch(mutate, expected):
    objects = render("overlays/ha-postgres")
    mutate(objects)
    problems = [p for check in checks.ALL_CHECKS.values() for p in check(objects)]
    assert any(expected in p for p in problems), problems


def test_the_store_copy_example_reads_the_sqlite_claim_and_writes_postgres():
    """examples/sqlite-to-postgres copies from the SQLite file production's
    control plane writes into the DSN and key the replicas read."""
    job = next(c for c in containers(render("examples/sqlite-to-postgres")) if c.subcommand == "store copy")
    prod = next(c for c in containers(render("overlays/production")) if c.binary == "agentmesh-control-plane")
    ha = next(c for c in containers(render("overlays/ha-postgres")) if c.binary == "agentmesh-control-plane")
    assert job.flag("--from") == prod.flag("--db")
    assert (job.volume("data") or {})["persistentVolumeClaim"] == (prod.volume("data") or {})["persistentVolumeClaim"]
    assert job.secret_ref(job.flags()["--to"][-1]) == ha.secret_ref(ha.flags()["--db"][-1])
    assert job.flag("--key-encryption-key-file") == ha.flag("--key-encryption-key-file")
    assert job.volume("key-encryption-key") == ha.volume("key-encryption-key")
    assert [e for e in job.spec["env"] if e["name"] == "PGPASSWORD"] == [
        e for e in ha.spec["env"] if e["name"] == "PGPASSWORD"
    ]
