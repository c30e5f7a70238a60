"""Policy checks over rendered manifests: what a schema cannot see.

Each check takes the rendered objects of one kustomization and returns a list
of problems (empty = fine), so tests can assert both that the real manifests
pass and that a deliberately broken copy is caught.
"""

from __future__ import annotations

import math
import posixpath
import re
import urllib.parse
from typing import Any, Callable

from addresses import address_problems
from model import (
    DEFAULT_DB,
    HTTP_LISTENER_FLAG,
    VAR_REF,
    Container,
    addr_port,
    containers,
    find,
    parse_quantity,
    pod_label_sets,
    pod_template,
    selector_matches,
    sqlite_path,
    store_kind,
    workloads,
)

from sizing import (
    LOW_WATERMARK_PERCENT,
    MIB,
    RSS_BASE_BYTES,
    RSS_HEADROOM,
    RSS_PER_MEMBER_BYTES,
    RouterSizing,
    router_sizing,
)

# Flags each program accepts, spelled as in issues 2, 3 and 4. A flag used in
# a manifest must be one of these (and, when built binaries are at hand,
# test_binaries.py checks them against `--help`).
# fmt: off
KNOWN_FLAGS: dict[str, set[str]] = {
    "agentmesh-control-plane": {
        # issue 2
        "--grpc-addr", "--http-addr", "--public-url", "--tls-cert", "--tls-key", "--insecure", "--db",
        "--enroll-rate-per-sec", "--enroll-burst", "--credential-ttl-secs", "--clock-skew-secs",
        "--refresh-grace-secs", "--key-rotation-interval-secs", "--key-publish-ahead-secs",
        "--key-grace-secs", "--node-retention-secs", "--ephemeral-retention-secs", "--lease-ttl-secs",
        "--admin-token-file", "--pprof-addr",
        # controlplane/src/config.rs
        "--refresh-rate-per-sec", "--refresh-burst", "--enroll-failures-per-ip-per-min",
        "--failure-guard-max-ips", "--key-check-interval-secs", "--enrollment-retention-secs",
        "--used-token-retention-secs", "--reap-interval-secs", "--db-max-inflight", "--db-wait-timeout-secs",
        "--directory-cache-ms", "--shutdown-grace-secs",
        # issue 17 (the two failure-guard flags above are still accepted as aliases)
        "--auth-failures-per-source-per-min", "--failure-guard-max-sources", "--unauth-rate-per-sec",
        "--unauth-burst", "--lease-rate-per-sec", "--lease-burst", "--source-table-max-sources",
        "--ipv6-source-prefix-len",
        # issue 18
        "--policy", "--policy-allow-all", "--policy-retention-secs", "--policy-check-interval-ms",
        # the replicas issue (PostgreSQL, controlplane/src/config/mod.rs)
        "--key-encryption-key-file", "--previous-key-encryption-key-file", "--db-pool-connections",
        "--db-read-connections", "--db-unready-after-secs", "--grpc-max-connection-age-secs",
    },
    "agentmesh-control-plane backup": {"--db", "--to"},
    # controlplane/src/cli.rs, StoreCmd::Copy
    "agentmesh-control-plane store copy": {
        "--from", "--to", "--from-key-encryption-key-file", "--key-encryption-key-file",
    },
    "agentmesh-router": {
        # issues 3 and 4
        "--control-plane", "--control-plane-ca", "--token-file", "--key-path", "--listen",
        "--external-addr", "--label", "--metrics-addr", "--auth-deadline-secs",
        # runtime/src/cli/args.rs (replicas; ha-postgres dials them by the headless name)
        "--control-plane-endpoint",
        "--relay-max-reservations", "--relay-max-circuits-per-peer", "--relay-circuit-duration-secs",
        "--relay-circuit-bytes", "--lease-interval-secs", "--high-watermark", "--low-watermark",
        "--memory-limit-bytes", "--drain-grace-secs", "--pprof-addr",
        # router/src/main.rs
        "--relay-max-circuits", "--relay-reservation-duration-secs", "--clock-skew-secs",
        "--stream-timeout-secs", "--auth-max-inflight-streams", "--catalog-max-inflight-streams",
        "--catalog-max-records", "--catalog-max-results", "--idle-connection-timeout-secs",
        "--control-plane-retry-budget-secs", "--control-plane-rpc-timeout-secs",
        "--goaway-max-concurrent-streams", "--goaway-retry-after-secs", "--trim-close-grace-secs",
        # router/src/resources/config.rs
        "--memory-default-limit-bytes", "--memory-budget-percent", "--connection-charge-bytes",
        "--stream-budget-system", "--stream-budget", "--peer-stream-budget-total", "--peer-stream-budget",
        "--circuits-per-destination", "--relay-stop-handshakes-per-connection",
        "--unauthenticated-connections-per-ip",
        "--failed-logins-per-ip-per-minute", "--quic-max-concurrent-streams", "--quic-max-stream-data-bytes",
        "--quic-max-connection-data-bytes", "--pending-connections-max", "--high-watermark-memory-percent",
    },
    # A member (examples/member-sidecar); node/src/cli.rs
    "agentmesh-node run": {
        "--control-plane", "--control-plane-ca", "--token-file", "--data-dir", "--routers",
        "--router-selector", "--router-prefer", "--expose", "--forward", "--allow", "--metrics-addr",
        "--socket-path", "--shutdown-grace-secs", "--log-format", "--listen-port", "--direct",
    },
}
# fmt: on

# Flags whose value is a file the program reads or writes.
FILE_FLAGS = {
    "--tls-cert",
    "--tls-key",
    "--admin-token-file",
    "--token-file",
    "--control-plane-ca",
    "--key-path",
    "--to",
    "--policy",
    "--key-encryption-key-file",
    "--previous-key-encryption-key-file",
    "--from-key-encryption-key-file",
}
# Of those, the ones the program writes (their directory must be writable).
WRITTEN_FILE_FLAGS = {"--key-path", "--to"}
# Flags whose value is a database URL: a sqlite:// one names a file the
# program writes (beside it the WAL, and the .kek by default); a
# postgres:// one names none. `store copy` takes URLs in --from and --to.
DB_URL_FLAGS = {"--db", "--from"}
PROGRAM_DB_URL_FLAGS = {"agentmesh-control-plane store copy": {"--from", "--to"}}

# SIGTERM -> go-away fan-out -> grace -> close must fit in the pod's grace.
DRAIN_MARGIN_SECS = 15
# Members a draining router moves per second, measured: 5,829 re-attached
# make-before-break within a 30 s grace (ladder/RESULTS.md,
# results/20261129T1339Z-release-10000-storm; 2 cores shared by the whole
# mesh, so a floor). A grace shorter than the members it holds / this cuts
# the rest (they re-attach after the cut instead of before it).
DRAIN_MOVES_PER_SEC = 190
# A router must lease at least three times per lease TTL.
LEASES_PER_TTL = 3
# The control-plane client's default retry budget (issue 2): a fleet cold
# start must get through the enrollment limiter within it.
ENROLL_RETRY_BUDGET_SECS = 180
# The control plane's --shutdown-grace-secs default (controlplane/src/config.rs).
CONTROL_PLANE_SHUTDOWN_GRACE_SECS = 10
SHUTDOWN_MARGIN_SECS = 5
# The variable the control plane reads a key-encryption key from
# (controlplane/src/store/seal.rs, KEK_ENV).
KEK_ENV = "AGENTMESH_KEY_ENCRYPTION_KEY"
FLEET_ANNOTATION = "agentmesh/sized-for-members"
K_ANNOTATION = "agentmesh/routers-per-member"

# Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
}


def mount_for(c: Container, path: str) -> dict[str, Any] | None:
    """The deepest volumeMount containing `path`."""
    best = None
    for m in c.mounts():
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                best = m
    return best


def check_pod_security(objects: list[dict[str, Any]]) -> list[str]:
    """The restricted Pod Security Standard, plus read-only roots and no API token."""
    problems = []
    for w in workloads(objects):
        spec = (pod_template(w) or {}).get("spec", {})
        where = f"{w['kind']}/{w['metadata']['name']}"
        psc = spec.get("securityContext", {}) or {}
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(host):
                problems.append(f"{where}: {host}")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: mounts a service account token it does not need")
        for v in spec.get("volumes", []) or []:
            kinds = set(v) - {"name"}
            if not kinds <= RESTRICTED_VOLUME_TYPES:
                problems.append(f"{where}: volume {v['name']} of type {sorted(kinds)}")
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            csc = c.get("securityContext", {}) or {}
            cw = f"{where}/{c['name']}"
            if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
                problems.append(f"{cw}: runAsNonRoot is not true")
            if csc.get("runAsUser", psc.get("runAsUser")) == 0:
                problems.append(f"{cw}: runs as uid 0")
            seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                problems.append(f"{cw}: seccompProfile is {seccomp}")
            if csc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{cw}: allowPrivilegeEscalation is not false")
            if csc.get("privileged"):
                problems.append(f"{cw}: privileged")
            caps = csc.get("capabilities", {}) or {}
            if "ALL" not in (caps.get("drop") or []):
                problems.append(f"{cw}: does not drop ALL capabilities")
            if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
                problems.append(f"{cw}: adds capabilities {caps.get('add')}")
            if csc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{cw}: root filesystem is writable")
            for p in c.get("ports", []) or []:
                if p.get("hostPort"):
                    problems.append(f"{cw}: hostPort {p['hostPort']}")
            res = c.get("resources", {}) or {}
            for kind, key in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
                if key not in (res.get(kind) or {}):
                    problems.append(f"{cw}: no resources.{kind}.{key}")
    return problems


def check_env_references(objects: list[dict[str, Any]]) -> list[str]:
    """Every $(VAR) resolves (env order matters), every envFrom ConfigMap exists, and
    every key of those ConfigMaps is used (a misspelt key in a patch would do nothing)."""
    problems = []
    for c in containers(objects):
        defined: set[str] = set()
        from_maps: dict[str, str] = {}
        for src in c.spec.get("envFrom", []) or []:
            ref = src.get("configMapRef")
            if not ref:
                problems.append(f"{c.where}: envFrom other than configMapRef")
                continue
            cm = find(objects, "ConfigMap", ref["name"])
            if cm is None:
                problems.append(f"{c.where}: envFrom ConfigMap {ref['name']} is not rendered")
                continue
            for k in cm.get("data") or {}:
                defined.add(k)
                from_maps[k] = ref["name"]
        used: set[str] = set()
        for e in c.spec.get("env", []) or []:
            for var in VAR_REF.findall(str(e.get("value", ""))):
                used.add(var)
                if var not in defined:
                    problems.append(f"{c.where}: env {e['name']} uses $({var}) before it is defined")
            defined.add(e["name"])
        for arg in (c.spec.get("command") or []) + (c.spec.get("args") or []):
            for var in VAR_REF.findall(str(arg)):
                used.add(var)
                if var not in defined:
                    problems.append(f"{c.where}: argument {arg!r} uses undefined $({var})")
        for k, cm_name in sorted(from_maps.items()):
            if k not in used:
                problems.append(f"{c.where}: key {k} of ConfigMap {cm_name} is used by no flag")
    return problems


def check_flags(objects: list[dict[str, Any]]) -> list[str]:
    """Flags are ones the programs have; files they name are mounted (writable where written)."""
    problems = []
    for c in containers(objects):
        if not c.binary:
            continue
        program = c.binary + (f" {c.subcommand}" if c.subcommand else "")
        known = KNOWN_FLAGS.get(program)
        if known is None:
            problems.append(f"{c.where}: unknown program {program!r}")
            continue
        for name, values in c.flags().items():
            if name not in known:
                problems.append(f"{c.where}: {program} has no flag {name}")
            if len(values) > 1 and name not in (
                "--listen",
                "--external-addr",
                "--label",
                "--stream-budget",
                "--peer-stream-budget",
            ):
                problems.append(f"{c.where}: {name} given {len(values)} times")
            url_flags = PROGRAM_DB_URL_FLAGS.get(program, DB_URL_FLAGS)
            if name in FILE_FLAGS or name in url_flags:
                path = c.expand(values[-1])
                if name in url_flags:
                    if sqlite_path(path) is None:
                        continue  # PostgreSQL: no file (check_database_secrets judges the URL)
                    path = sqlite_path(path) or ""
                m = mount_for(c, path)
                if m is None:
                    problems.append(f"{c.where}: {name} {path} is on no volume")
                    continue
                vol = c.volume(m["name"]) or {}
                items = (vol.get("secret") or vol.get("configMap") or {}).get("items")
                rel = posixpath.relpath(path, m["mountPath"])
                if items is not None and rel not in {i["path"] for i in items}:
                    problems.append(f"{c.where}: {name} {path} is not an item of volume {m['name']}")
                if (name in WRITTEN_FILE_FLAGS or name in url_flags) and (
                    m.get("readOnly") or not ({"persistentVolumeClaim", "emptyDir"} & set(vol))
                ):
                    problems.append(f"{c.where}: {name} {path} is written but its volume is not writable storage")
    return problems


def _single(items: list[Container], what: str, problems: list[str]) -> Container | None:
    if len(items) != 1:
        problems.append(f"expected exactly one {what}, found {len(items)}")
        return None
    return items[0]


def _probe_problems(c: Container, listen_flag: str) -> list[str]:
    out = []
    port = addr_port(c.flag(listen_flag))
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.spec.get(probe) or {}).get("httpGet")
        if not get:
            out.append(f"{c.where}: no HTTP {probe}")
            continue
        if get.get("path") != path:
            out.append(f"{c.where}: {probe} checks {get.get('path')}, should be {path}")
        if c.port_number(get.get("port")) != port or port is None:
            out.append(f"{c.where}: {probe} port {get.get('port')} is not the {listen_flag} port {port}")
    return out


def check_router(objects: list[dict[str, Any]]) -> list[str]:
    """Routers: drain fits the grace period, memory limit feeds the budget and covers
    the watermark, one Service per pod, a PDB, lease cadence, the control-plane URL."""
    problems: list[str] = []
    routers = [c for c in containers(objects) if c.binary == "agentmesh-router"]
    if not routers:
        return problems
    c = _single(routers, "router container", problems)
    if c is None:
        return problems
    sts = c.workload
    if sts["kind"] != "StatefulSet":
        problems.append(f"{c.where}: routers must be a StatefulSet (stable identity and address)")
        return problems
    name = sts["metadata"]["name"]
    spec = sts["spec"]
    problems += _probe_problems(c, HTTP_LISTENER_FLAG["agentmesh-router"])

    res = c.spec.get("resources", {}) or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    if "cpu" in limits:
        problems.append(f"{c.where}: has a CPU limit (CFS throttling stalls handshakes)")
    if "memory" not in limits:
        problems.append(f"{c.where}: has no memory limit")
        return problems
    limit = parse_quantity(limits["memory"])
    if parse_quantity(requests.get("memory", 0)) != limit:
        problems.append(f"{c.where}: memory request differs from limit (overcommitted memory)")

    mem_flag = (c.flags().get("--memory-limit-bytes") or [""])[-1]
    var = VAR_REF.fullmatch(mem_flag)
    env = {e["name"]: e for e in c.spec.get("env", []) or []}
    ref = (env.get(var.group(1), {}).get("valueFrom") or {}).get("resourceFieldRef") if var else None
    if (
        not ref
        or ref.get("resource") != "limits.memory"
        or ref.get("containerName", c.name) != c.name
        or parse_quantity(ref.get("divisor", "1")) != 1
    ):
        problems.append(f"{c.where}: --memory-limit-bytes is not the container's memory limit in bytes")

    try:
        sz = router_sizing(int(limit), c.flag)
        drain = int(c.flag("--drain-grace-secs") or "")
    except ValueError:
        problems.append(f"{c.where}: sizing flags and drain grace must be integers")
        return problems
    problems += _memory_problems(c, sz, limits["memory"])
    low = sz.low

    grace = (pod_template(sts) or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30)
    if grace < drain + DRAIN_MARGIN_SECS:
        problems.append(f"{c.where}: terminationGracePeriodSeconds {grace} < drain grace {drain} + {DRAIN_MARGIN_SECS}")
    if int(spec.get("minReadySeconds", 0)) < 10:
        problems.append(f"{c.where}: minReadySeconds < 10: a rollout would not wait for members to settle")
    if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") != "RollingUpdate":
        problems.append(f"{c.where}: updateStrategy is not RollingUpdate")

    problems += address_problems(c, objects)

    headless = find(objects, "Service", spec.get("serviceName", ""))
    if headless is None or headless["spec"].get("clusterIP") != "None":
        problems.append(f"{c.where}: serviceName {spec.get('serviceName')} is not a rendered headless Service")
    replicas = int(spec.get("replicas", 1))
    per_pod = {
        s["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]: s
        for s in objects
        if s["kind"] == "Service" and "statefulset.kubernetes.io/pod-name" in (s["spec"].get("selector") or {})
    }
    wanted = {f"{name}-{i}" for i in range(replicas)}
    for pod in sorted(wanted - set(per_pod)):
        problems.append(f"{c.where}: pod {pod} has no Service of its own")
    for pod in sorted(set(per_pod) - wanted):
        problems.append(f"Service/{per_pod[pod]['metadata']['name']}: selects {pod}, beyond {replicas} replicas")
    for pod, svc in per_pod.items():
        if svc["metadata"]["name"] != pod:
            problems.append(f"Service/{svc['metadata']['name']}: should be named {pod}, like its pod")

    labels = (pod_template(sts) or {}).get("metadata", {}).get("labels", {})
    pdbs = [
        p for p in objects if p["kind"] == "PodDisruptionBudget" and selector_matches(p["spec"].get("selector"), labels)
    ]
    if not pdbs:
        problems.append(f"{c.where}: no PodDisruptionBudget")
    for p in pdbs:
        if p["spec"].get("maxUnavailable") != 1:
            problems.append(f"PodDisruptionBudget/{p['metadata']['name']}: maxUnavailable should be 1")

    cps = [x for x in containers(objects) if x.binary == "agentmesh-control-plane" and not x.subcommand]
    problems += _fleet_problems(c, sts, low, cps, drain)
    for cp in cps:
        if c.flag("--control-plane") != cp.flag("--public-url"):
            problems.append(
                f"{c.where}: --control-plane {c.flag('--control-plane')} != control plane --public-url "
                f"{cp.flag('--public-url')} (proofs sign that URL)"
            )
        try:
            ttl, interval = int(cp.flag("--lease-ttl-secs") or ""), int(c.flag("--lease-interval-secs") or "")
            if interval * LEASES_PER_TTL > ttl:
                problems.append(f"{c.where}: lease interval {interval}s x {LEASES_PER_TTL} > lease TTL {ttl}s")
        except ValueError:
            problems.append(f"{c.where}: lease interval / TTL are not integers")
    return problems


def _memory_problems(c: Container, sz: RouterSizing, limit: str) -> list[str]:
    """The router's charges cover the measured RSS, an explicit watermark stays within
    what the budget is sized for, and the limit holds the RSS at the high watermark."""
    problems = []
    if sz.idle_member_charge_bytes < RSS_PER_MEMBER_BYTES:
        problems.append(
            f"{c.where}: idle member charge {sz.idle_member_charge_bytes // 1024} KiB < measured RSS per member "
            f"{RSS_PER_MEMBER_BYTES // 1024} KiB: the budget would admit more members than memory holds"
        )
    if sz.explicit_high and sz.high > sz.sized_high:
        problems.append(
            f"{c.where}: --high-watermark {sz.high} > {sz.sized_high}, what the memory budget is sized for "
            f"(limit {limit}); raise the limit instead, or drop the flag and let the router derive it"
        )
    if c.flag("--low-watermark") is not None and sz.low != sz.high * LOW_WATERMARK_PERCENT // 100:
        problems.append(f"{c.where}: low watermark {sz.low} is not 15% below high {sz.high}")
    if sz.reservations < sz.high:
        problems.append(
            f"{c.where}: --relay-max-reservations {sz.reservations} < high watermark {sz.high}: "
            "admitted members beyond it could not reserve a relay slot"
        )
    if sz.limit_bytes < sz.limit_needed_bytes:
        problems.append(
            f"{c.where}: memory limit {limit} < {sz.limit_needed_bytes / MIB:.0f} MiB, the measured RSS at high "
            f"watermark {sz.high} ({RSS_BASE_BYTES // MIB} MiB + {RSS_PER_MEMBER_BYTES // 1024} KiB per member) "
            f"x {RSS_HEADROOM}"
        )
    return problems


def _fleet_problems(c: Container, sts: dict[str, Any], low: int, cps: list[Container], drain: int) -> list[str]:
    """The sizing rule for the fleet the StatefulSet says it is sized for."""
    ann = sts["metadata"].get("annotations") or {}
    try:
        fleet, k = int(ann[FLEET_ANNOTATION]), int(ann[K_ANNOTATION])
    except (KeyError, ValueError):
        return [f"{c.where}: annotations {FLEET_ANNOTATION} and {K_ANNOTATION} must state the fleet it is sized for"]
    n = int(sts["spec"].get("replicas", 1))
    if n < 2 or k > n - 1:
        return [f"{c.where}: {n} routers cannot keep K={k} routers per member with one router lost"]
    problems = []
    after_loss = math.ceil(fleet * k / (n - 1))
    if after_loss > low:
        problems.append(
            f"{c.where}: with one of {n} routers lost, {fleet} x {k} / {n - 1} = {after_loss} "
            f"members per router > low watermark {low}"
        )
    drain_needed = math.ceil(after_loss / DRAIN_MOVES_PER_SEC)
    if drain < drain_needed:
        problems.append(
            f"{c.where}: drain grace {drain}s < {drain_needed}s, the time to move {after_loss} members "
            f"(one router lost) at the measured {DRAIN_MOVES_PER_SEC} per second"
        )
    for cp in cps:
        try:
            rate, burst = int(cp.flag("--enroll-rate-per-sec") or ""), int(cp.flag("--enroll-burst") or "")
        except ValueError:
            problems.append(f"{cp.where}: enroll rate and burst must be integers")
            continue
        if rate * ENROLL_RETRY_BUDGET_SECS + burst < fleet:
            problems.append(
                f"{cp.where}: a cold start of {fleet} members needs rate x {ENROLL_RETRY_BUDGET_SECS} s "
                f"+ burst >= {fleet}, have {rate} x {ENROLL_RETRY_BUDGET_SECS} + {burst}"
            )
    return problems


def check_control_plane(objects: list[dict[str, Any]]) -> list[str]:
    """Control plane: the shape its store needs (SQLite: one pod, Recreate, a
    claim, backups; PostgreSQL: several replicas rolled without losing one,
    spread, a PDB, a preStop, the DSN and key from Secrets, a headless
    Service), grace periods, probes, key grace, policy, the public URL."""
    problems: list[str] = []
    cps = [c for c in containers(objects) if c.binary == "agentmesh-control-plane" and not c.subcommand]
    if not cps:
        return problems
    c = _single(cps, "control-plane container", problems)
    if c is None:
        return problems
    if store_kind(c) == "sqlite":
        problems += _sqlite_problems(c, objects)
    else:
        problems += _postgres_problems(c, objects)
    problems += _probe_problems(c, HTTP_LISTENER_FLAG["agentmesh-control-plane"])
    problems += _grace_problems(c)
    if "cpu" in ((c.spec.get("resources") or {}).get("limits") or {}):
        problems.append(f"{c.where}: has a CPU limit")
    try:
        ttl, skew, grace = (
            int(c.flag(f) or "") for f in ("--credential-ttl-secs", "--clock-skew-secs", "--key-grace-secs")
        )
        if grace < ttl + skew:
            problems.append(
                f"{c.where}: --key-grace-secs {grace} < credential TTL {ttl} + skew {skew} (refuses to start)"
            )
    except ValueError:
        problems.append(f"{c.where}: TTL, skew and key grace must be integers")
    problems += _policy_problems(c, objects)
    problems += _public_url_problems(c, objects)
    return problems


def pre_stop_secs(c: Container) -> int | None:
    """The seconds a preStop hook waits (a sleep action, or an exec of `sleep N`);
    None without a hook, 0 for a hook whose length is not known."""
    hook = (c.spec.get("lifecycle") or {}).get("preStop")
    if not hook:
        return None
    if "sleep" in hook:
        return int(hook["sleep"].get("seconds", 0))
    cmd = [str(x) for x in (hook.get("exec") or {}).get("command") or []]
    if len(cmd) == 2 and cmd[0].rsplit("/", 1)[-1] == "sleep" and cmd[1].isdigit():
        return int(cmd[1])
    return 0


def _grace_problems(c: Container) -> list[str]:
    """SIGTERM comes after the preStop hook; both fit in the pod's grace period."""
    grace = c.pod_spec.get("terminationGracePeriodSeconds", 30)
    shutdown = int(c.flag("--shutdown-grace-secs") or CONTROL_PLANE_SHUTDOWN_GRACE_SECS)
    pre = pre_stop_secs(c) or 0
    if grace < pre + shutdown + SHUTDOWN_MARGIN_SECS:
        before = f"preStop {pre} + " if pre else ""
        return [
            f"{c.where}: terminationGracePeriodSeconds {grace} < {before}shutdown grace {shutdown} "
            f"+ {SHUTDOWN_MARGIN_SECS}"
        ]
    return []


def _claim_of(c: Container, path: str | None) -> str | None:
    """The claim of the volume holding `path`, if it is a PersistentVolumeClaim."""
    m = mount_for(c, path or "") if path and path.startswith("/") else None
    return ((c.volume(m["name"]) or {}).get("persistentVolumeClaim") or {}).get("claimName") if m else None


def _sqlite_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """One pod, replaced with Recreate, its file on a rendered claim, backed up
    by a job on the same claim and node."""
    problems = []
    w = c.workload
    if (
        w["kind"] != "Deployment"
        or w["spec"].get("replicas", 1) != 1
        or (w["spec"].get("strategy") or {}).get("type") != "Recreate"
    ):
        problems.append(f"{c.where}: SQLite needs a single-replica Deployment with strategy Recreate")
    db = c.flag("--db") or DEFAULT_DB
    db_claim = _claim_of(c, sqlite_path(db))
    if db_claim is None or find(objects, "PersistentVolumeClaim", db_claim) is None:
        problems.append(
            f"{c.where}: SQLite file {sqlite_path(db)} is not on a rendered PersistentVolumeClaim "
            "(the database would go with the pod)"
        )
    backups = [x for x in containers(objects) if x.binary == "agentmesh-control-plane" and x.subcommand == "backup"]
    if not backups:
        problems.append(f"{c.where}: no backup job")
    for b in backups:
        if b.flag("--db") != c.flag("--db"):
            problems.append(f"{b.where}: backs up {b.flag('--db')}, the control plane uses {c.flag('--db')}")
        claim = _claim_of(b, sqlite_path(b.flag("--db")))
        if claim != db_claim:
            problems.append(f"{b.where}: mounts claim {claim}, the control plane's data is {db_claim}")
        pvc = find(objects, "PersistentVolumeClaim", db_claim or "")
        if pvc and "ReadWriteOnce" in pvc["spec"].get("accessModes", []):
            terms = ((b.pod_spec.get("affinity") or {}).get("podAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            ) or []
            if not any(
                selector_matches(t.get("labelSelector"), c.pod_labels)
                and t.get("topologyKey") == "kubernetes.io/hostname"
                for t in terms
            ):
                problems.append(f"{b.where}: ReadWriteOnce data but no required affinity to the control plane's node")
        if b.workload["kind"] == "CronJob" and b.workload["spec"].get("concurrencyPolicy") != "Forbid":
            problems.append(f"{b.where}: concurrencyPolicy is not Forbid")
    return problems


def _postgres_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """Several interchangeable replicas on one database (docs/storage.md)."""
    problems = []
    w = c.workload
    if w["kind"] != "Deployment":
        return [f"{c.where}: PostgreSQL replicas are interchangeable: run them as a Deployment, not a {w['kind']}"]
    replicas = int(w["spec"].get("replicas", 1))
    if replicas < 2:
        problems.append(
            f"{c.where}: {replicas} replica on PostgreSQL: run at least 2, so a restart or a node loss "
            "leaves one serving"
        )
    strategy = w["spec"].get("strategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        problems.append(f"{c.where}: strategy {strategy.get('type')}: replicas on PostgreSQL roll (RollingUpdate)")
    elif str(rolling.get("maxUnavailable", "25%")) not in ("0", "0%"):
        problems.append(
            f"{c.where}: rollingUpdate.maxUnavailable {rolling.get('maxUnavailable', '25% (default)')}, "
            "should be 0: a rollout would stop a replica before its replacement is ready"
        )
    problems += _pdb_problems(c, objects, replicas)
    if not _spread_over_nodes(c):
        problems.append(
            f"{c.where}: no pod anti-affinity (or topology spread) over kubernetes.io/hostname: replicas may share "
            "the node whose loss takes them together"
        )
    if pre_stop_secs(c) is None:
        problems.append(
            f"{c.where}: no preStop hook: SIGTERM would close the listener while the Services still send it "
            "new connections"
        )
    if c.secret_ref((c.flags().get("--db") or [""])[-1]) is None:
        problems.append(
            f"{c.where}: --db is not $(VAR) of an env item from a Secret: the PostgreSQL DSN (user, host, "
            "maybe password) is a secret, never a literal in args or a ConfigMap"
        )
    problems += _kek_problems(c)
    for v in c.pod_spec.get("volumes", []) or []:
        if "persistentVolumeClaim" in v:
            problems.append(
                f"{c.where}: mounts claim {v['persistentVolumeClaim']['claimName']}: the state is in PostgreSQL, "
                "and a ReadWriteOnce claim would hold every replica on one node"
            )
    for b in containers(objects):
        if b.binary == "agentmesh-control-plane" and b.subcommand == "backup":
            problems.append(
                f"{b.where}: a SQLite backup job, but the control plane runs on PostgreSQL "
                "(back it up with the server's own tools)"
            )
    problems += _headless_problems(c, objects)
    problems += _router_endpoint_problems(c, objects)
    return problems


def _router_endpoint_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """Routers of several replicas dial them through the headless Service
    (`--control-plane-endpoint=dns+SCHEME://HEADLESS:PORT`), so a frozen
    replica is skipped and their watches spread; the scheme is the logical
    URL's (TLS checks the logical name on every address)."""
    grpc = addr_port(c.flag("--grpc-addr"))
    ns = c.workload["metadata"].get("namespace")
    headless = {}
    for s in objects:
        if (
            s["kind"] == "Service"
            and s["spec"].get("clusterIP") == "None"
            and selector_matches(s["spec"].get("selector"), c.pod_labels)
        ):
            name = s["metadata"]["name"]
            ports = {p.get("port") for p in s["spec"].get("ports", []) if c.port_number(p.get("targetPort", p.get("port"))) == grpc}
            for n in [name] + ([f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"] if ns else []):
                headless[n] = ports
    problems = []
    for r in containers(objects):
        if r.binary != "agentmesh-router":
            continue
        logical = urllib.parse.urlsplit(r.flag("--control-plane") or "").scheme
        names = [r.expand(v) for v in r.flags().get("--control-plane-endpoint", [])]
        by_dns = [urllib.parse.urlsplit(v.removeprefix("dns+")) for v in names if v.startswith("dns+")]
        if not by_dns:
            problems.append(
                f"{r.where}: no --control-plane-endpoint=dns+{logical or 'https'}://<headless Service>:<port>: "
                "routers would reach the replicas only through the balancing Service, held on one replica "
                "(frozen or not) per connection"
            )
            continue
        for u in by_dns:
            if u.hostname not in headless:
                problems.append(f"{r.where}: --control-plane-endpoint host {u.hostname} is no headless Service over the replicas")
            elif u.port not in headless[u.hostname]:
                problems.append(f"{r.where}: --control-plane-endpoint port {u.port} does not reach the gRPC port {grpc}")
            if logical and u.scheme != logical:
                problems.append(
                    f"{r.where}: --control-plane-endpoint is {u.scheme}, --control-plane {logical}: "
                    "one scheme, since TLS checks the logical name on every address"
                )
    return problems


def _pdb_problems(c: Container, objects: list[dict[str, Any]], replicas: int) -> list[str]:
    """A PDB that lets node drains take one replica at a time, never all."""
    pdbs = [
        p
        for p in objects
        if p["kind"] == "PodDisruptionBudget" and selector_matches(p["spec"].get("selector"), c.pod_labels)
    ]
    if not pdbs:
        return [f"{c.where}: no PodDisruptionBudget: a node drain may evict every replica at once"]
    problems = []
    for p in pdbs:
        where = f"PodDisruptionBudget/{p['metadata']['name']}"
        spec = p["spec"]
        value = spec.get("maxUnavailable", spec.get("minAvailable"))
        if not isinstance(value, int):
            problems.append(f"{where}: give a number of replicas, not {value!r}")
            continue
        unavailable = value if "maxUnavailable" in spec else replicas - value
        if unavailable < 1:
            problems.append(f"{where}: allows no eviction of {replicas} replicas: node drains would block")
        elif unavailable > replicas - 1:
            problems.append(f"{where}: lets every one of {replicas} replicas be evicted at once")
    return problems


def _spread_over_nodes(c: Container) -> bool:
    """Anti-affinity (preferred or required) or a topology spread over nodes."""
    anti = (c.pod_spec.get("affinity") or {}).get("podAntiAffinity") or {}
    terms = list(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    terms += [t.get("podAffinityTerm") or {} for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    terms += c.pod_spec.get("topologySpreadConstraints") or []
    return any(
        t.get("topologyKey") == "kubernetes.io/hostname" and selector_matches(t.get("labelSelector"), c.pod_labels)
        for t in terms
    )


def _kek_problems(c: Container) -> list[str]:
    """PostgreSQL has no default key-encryption key: a file from a Secret, or
    the variable from a Secret (docs/storage.md, "Signing keys at rest")."""
    path = c.flag("--key-encryption-key-file")
    if path is not None:
        m = mount_for(c, path)
        if m is None or "secret" not in (c.volume(m["name"]) or {}):
            return [f"{c.where}: --key-encryption-key-file {path} is not on a Secret volume"]
        return []
    if c.secret_ref(f"$({KEK_ENV})") is not None:
        return []
    return [
        f"{c.where}: no key-encryption key: PostgreSQL needs --key-encryption-key-file on a Secret volume "
        f"or {KEK_ENV} from a Secret, or the control plane refuses to start"
    ]


def _headless_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """A headless Service over the ready replicas' gRPC port: their own
    addresses, for clients that balance themselves."""
    grpc = addr_port(c.flag("--grpc-addr"))
    headless = [
        s
        for s in objects
        if s["kind"] == "Service"
        and s["spec"].get("clusterIP") == "None"
        and selector_matches(s["spec"].get("selector"), c.pod_labels)
    ]
    if not headless:
        return [f"{c.where}: no headless Service over the replicas (clients balancing themselves need their addresses)"]
    problems = []
    for s in headless:
        where = f"Service/{s['metadata']['name']}"
        if s["spec"].get("publishNotReadyAddresses"):
            problems.append(f"{where}: publishes replicas that are not ready")
        if not any(c.port_number(p.get("targetPort", p.get("port"))) == grpc for p in s["spec"].get("ports", [])):
            problems.append(f"{where}: no port to the gRPC port {grpc}")
    return problems


def _public_url_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """The URL members sign is served by a Service that balances over every
    replica (by its name or the name external-dns publishes for it), on a
    port to the gRPC port; not by the headless one, whose name would hold a
    client to the replica DNS gave it first."""
    url = c.flag("--public-url")
    if not url:
        return [f"{c.where}: no --public-url: members would sign the bound address"]
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    grpc = addr_port(c.flag("--grpc-addr"))
    ns = c.workload["metadata"].get("namespace")

    def names(svc: dict[str, Any]) -> set[str]:
        name = svc["metadata"]["name"]
        out = {name}
        for n in [ns] if ns else []:
            out |= {f"{name}.{n}", f"{name}.{n}.svc", f"{name}.{n}.svc.cluster.local"}
        ann = (svc["metadata"].get("annotations") or {}).get("external-dns.alpha.kubernetes.io/hostname", "")
        return out | {h.strip() for h in ann.split(",") if h.strip()}

    services = [
        s for s in objects if s["kind"] == "Service" and selector_matches(s["spec"].get("selector"), c.pod_labels)
    ]
    named = [s for s in services if host in names(s)]
    balancing = [s for s in named if s["spec"].get("clusterIP") != "None"]
    if not balancing:
        if named:
            return [
                f"{c.where}: --public-url host {host} is the headless Service {named[0]['metadata']['name']}: "
                "clients would stay on the replica DNS gave them first; name the balancing Service"
            ]
        return [f"{c.where}: --public-url host {host} is no Service over the control plane (name or external-dns)"]
    problems = []
    for s in balancing:
        if not any(
            p.get("port") == port and c.port_number(p.get("targetPort", p.get("port"))) == grpc
            for p in s["spec"].get("ports", [])
        ):
            problems.append(f"Service/{s['metadata']['name']}: no port {port} to the gRPC port {grpc} (--public-url)")
    return problems


def _policy_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """The control plane starts with a policy from a rendered ConfigMap key.

    Without --policy (or --policy-allow-all) a fresh database denies every
    call and one with members refuses to start (docs/policy.md)."""
    path = c.flag("--policy")
    if path is None:
        if "--policy-allow-all" in c.flags():
            return []
        return [
            f"{c.where}: no --policy: a fresh database denies every call and one with members refuses to start"
        ]
    m = mount_for(c, path)
    vol = (c.volume(m["name"]) or {}) if m else {}
    cm = (vol.get("configMap") or {}).get("name")
    if cm is None:
        return [f"{c.where}: --policy {path} is not on a ConfigMap volume"]
    if m.get("subPath"):
        key = m["subPath"]
    else:
        rel = posixpath.relpath(path, m["mountPath"])
        items = (vol.get("configMap") or {}).get("items")
        key = next((i["key"] for i in items if i["path"] == rel), rel) if items else rel
    obj = find(objects, "ConfigMap", cm)
    if obj is None or key not in (obj.get("data") or {}):
        return [f"{c.where}: --policy {path} is key {key} of ConfigMap {cm}, which does not hold it"]
    return []


def check_selectors(objects: list[dict[str, Any]]) -> list[str]:
    """Services, PDBs and NetworkPolicies select rendered pods; Service target ports exist."""
    problems = []
    pods = pod_label_sets(objects)
    if not pods:
        return problems
    for o in objects:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "Service":
            sel = o["spec"].get("selector")
            matched = [w for w, labels in pods if selector_matches(sel, labels)]
            if not matched:
                problems.append(f"Service/{name}: selector {sel} matches no pod")
            for p in o["spec"].get("ports", []):
                tp = p.get("targetPort", p.get("port"))
                for w in matched:
                    conts = (pod_template(w) or {}).get("spec", {}).get("containers", [])
                    if not any(
                        q.get("name") == tp or q.get("containerPort") == tp
                        for cc in conts
                        for q in cc.get("ports", []) or []
                    ):
                        problems.append(
                            f"Service/{name}: targetPort {tp} is no port of {w['kind']}/{w['metadata']['name']}"
                        )
        elif kind == "PodDisruptionBudget":
            if not any(selector_matches(o["spec"].get("selector"), labels) for _, labels in pods):
                problems.append(f"PodDisruptionBudget/{name}: selects no pod")
        elif kind == "NetworkPolicy":
            if not any(selector_matches(o["spec"].get("podSelector"), labels) for _, labels in pods):
                problems.append(f"NetworkPolicy/{name}: selects no pod")
    return problems


def check_network_policies(objects: list[dict[str, Any]]) -> list[str]:
    """Metrics and HTTP admin listeners (/drain) reachable only from selected sources."""
    problems = []
    for c in containers(objects):
        flag = HTTP_LISTENER_FLAG.get(c.binary or "")
        if not flag or c.subcommand:
            continue
        port = addr_port(c.flag(flag))
        pols = [
            p
            for p in objects
            if p["kind"] == "NetworkPolicy" and selector_matches(p["spec"].get("podSelector"), c.pod_labels)
        ]
        if not pols:
            problems.append(f"{c.where}: no NetworkPolicy")
            continue
        for p in pols:
            for rule in p["spec"].get("ingress", []) or []:
                ports = [q.get("port") for q in rule.get("ports", []) or []]
                opens = not ports or port in ports or any(c.port_number(q) == port for q in ports if isinstance(q, str))
                if opens and not rule.get("from"):
                    problems.append(
                        f"NetworkPolicy/{p['metadata']['name']}: opens internal port {port} ({flag}) to everyone"
                    )
    return problems


def check_images(objects: list[dict[str, Any]]) -> list[str]:
    """Overlays pin images: a tag or digest, never `latest`; one image for our programs."""
    problems = []
    ours = set()
    for c in containers(objects):
        image = c.spec.get("image", "")
        last = image.rsplit("/", 1)[-1]
        if "@" not in image and (":" not in last or last.endswith(":latest")):
            problems.append(f"{c.where}: image {image!r} is not pinned to a tag or digest")
        if c.binary:
            ours.add(image)
    if len(ours) > 1:
        problems.append(f"programs run from different images: {sorted(ours)}")
    return problems


# Objects the manifests reference but do not contain: the operator creates
# them (deploy/k8s/README.md lists each; test_docs.py checks it does).
EXTERNAL_OBJECTS = {
    ("Secret", "agentmesh-control-plane-tls"),
    ("Secret", "agentmesh-admin-token"),
    ("Secret", "agentmesh-router-token"),
    ("Secret", "agentmesh-member-token"),
    ("ConfigMap", "agentmesh-control-plane-ca"),
    # PostgreSQL (overlays/ha-postgres, examples/sqlite-to-postgres).
    ("Secret", "agentmesh-control-plane-db"),
    ("Secret", "agentmesh-key-encryption-key"),
    # The SQLite control plane's claim, which examples/sqlite-to-postgres
    # reads (a serving control plane's own claim must be rendered with it:
    # check_control_plane).
    ("PersistentVolumeClaim", "agentmesh-control-plane-data"),
}


def check_volumes(objects: list[dict[str, Any]]) -> list[str]:
    """Every mount has a volume; every claim, ConfigMap and Secret is rendered or external."""
    problems = []
    for c in containers(objects):
        for m in c.mounts():
            if c.volume(m["name"]) is None:
                problems.append(f"{c.where}: mount {m['mountPath']} names no volume {m['name']}")
    claimed = set()
    for w in workloads(objects):
        where = f"{w['kind']}/{w['metadata']['name']}"
        spec = (pod_template(w) or {}).get("spec", {})
        refs = []
        for v in spec.get("volumes", []) or []:
            if "persistentVolumeClaim" in v:
                refs.append((f"volume {v['name']}", "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]))
                claimed.add(v["persistentVolumeClaim"]["claimName"])
            if "configMap" in v:
                refs.append((f"volume {v['name']}", "ConfigMap", v["configMap"]["name"]))
            if "secret" in v:
                refs.append((f"volume {v['name']}", "Secret", v["secret"]["secretName"]))
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for e in c.get("env", []) or []:
                src = e.get("valueFrom") or {}
                if "secretKeyRef" in src:
                    refs.append((f"env {e['name']}", "Secret", src["secretKeyRef"]["name"]))
                if "configMapKeyRef" in src:
                    refs.append((f"env {e['name']}", "ConfigMap", src["configMapKeyRef"]["name"]))
        for what, kind, name in refs:
            if find(objects, kind, name) is None and (kind, name) not in EXTERNAL_OBJECTS:
                problems.append(f"{where}: {what} needs {kind}/{name}, neither rendered nor documented")
    for o in objects:
        if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] not in claimed:
            problems.append(f"PersistentVolumeClaim/{o['metadata']['name']}: mounted by no workload")
    return problems


# A PostgreSQL URL, wherever it is written.
POSTGRES_URL = re.compile(r"postgres(?:ql)?://")
# Variables holding a secret themselves.
SECRET_ENV = {"PGPASSWORD", KEK_ENV}


def check_database_secrets(objects: list[dict[str, Any]]) -> list[str]:
    """A PostgreSQL DSN (user, host, maybe password), its password and the
    key-encryption key come from Secrets: never a literal in args, in an env
    value or in a ConfigMap, which anyone who can read the manifests (or
    `kubectl get configmap`) sees."""
    problems = []
    for o in objects:
        if o["kind"] == "ConfigMap":
            for k, v in (o.get("data") or {}).items():
                if POSTGRES_URL.search(str(v)):
                    problems.append(
                        f"ConfigMap/{o['metadata']['name']}: key {k} holds a PostgreSQL URL: put the DSN in a Secret"
                    )
    for c in containers(objects):
        for a in (c.spec.get("command") or []) + (c.spec.get("args") or []):
            if POSTGRES_URL.search(str(a)):
                problems.append(f"{c.where}: argument {a!r} is a literal PostgreSQL URL: give $(VAR) from a Secret")
        for e in c.spec.get("env", []) or []:
            if "value" not in e:
                continue
            if e["name"] in SECRET_ENV:
                problems.append(f"{c.where}: env {e['name']} is a literal: read it from a Secret (secretKeyRef)")
            elif POSTGRES_URL.search(str(e["value"])):
                problems.append(f"{c.where}: env {e['name']} is a literal PostgreSQL URL: read it from a Secret")
    return problems


ALL_CHECKS: dict[str, Callable[[list[dict[str, Any]]], list[str]]] = {
    "pod_security": check_pod_security,
    "env_references": check_env_references,
    "flags": check_flags,
    "router": check_router,
    "control_plane": check_control_plane,
    "selectors": check_selectors,
    "network_policies": check_network_policies,
    "volumes": check_volumes,
    "database_secrets": check_database_secrets,
}
