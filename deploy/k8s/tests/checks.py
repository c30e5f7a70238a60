"""Policy checks over rendered manifests: what a schema cannot see.

Each check takes the rendered objects of one kustomization and returns a list
of problems (empty = fine), so tests can assert both that the real manifests
pass and that a deliberately broken copy is caught.
"""

from __future__ import annotations

import math
import posixpath
from typing import Any, Callable

from addresses import address_problems
from model import (
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
    },
    "agentmesh-control-plane backup": {"--db", "--to"},
    "agentmesh-router": {
        # issues 3 and 4
        "--control-plane", "--control-plane-ca", "--token-file", "--key-path", "--listen",
        "--external-addr", "--label", "--metrics-addr", "--auth-deadline-secs",
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
        "--socket-path", "--shutdown-grace-secs", "--log-format",
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
    "--db",
    "--to",
    "--policy",
}
# Of those, the ones the program writes (their directory must be writable).
WRITTEN_FILE_FLAGS = {"--key-path", "--db", "--to"}

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


def file_of(flag: str, value: str) -> str:
    """The file a file flag names (`--db` takes a sqlite:// URL)."""
    if flag == "--db":
        return sqlite_path(value) or value
    return value


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
            if name in FILE_FLAGS:
                path = file_of(name, c.expand(values[-1]))
                m = mount_for(c, path)
                if m is None:
                    problems.append(f"{c.where}: {name} {path} is on no volume")
                    continue
                vol = c.volume(m["name"]) or {}
                items = (vol.get("secret") or vol.get("configMap") or {}).get("items")
                rel = posixpath.relpath(path, m["mountPath"])
                if items is not None and rel not in {i["path"] for i in items}:
                    problems.append(f"{c.where}: {name} {path} is not an item of volume {m['name']}")
                if name in WRITTEN_FILE_FLAGS and (
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
    """Control plane: one pod over SQLite, key grace long enough, probes, backups."""
    problems: list[str] = []
    cps = [c for c in containers(objects) if c.binary == "agentmesh-control-plane" and not c.subcommand]
    if not cps:
        return problems
    c = _single(cps, "control-plane container", problems)
    if c is None:
        return problems
    w = c.workload
    if sqlite_path(c.flag("--db")):
        if (
            w["kind"] != "Deployment"
            or w["spec"].get("replicas", 1) != 1
            or (w["spec"].get("strategy") or {}).get("type") != "Recreate"
        ):
            problems.append(f"{c.where}: SQLite needs a single-replica Deployment with strategy Recreate")
    problems += _probe_problems(c, HTTP_LISTENER_FLAG["agentmesh-control-plane"])
    grace = (pod_template(w) or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30)
    shutdown = int(c.flag("--shutdown-grace-secs") or CONTROL_PLANE_SHUTDOWN_GRACE_SECS)
    if grace < shutdown + SHUTDOWN_MARGIN_SECS:
        problems.append(
            f"{c.where}: terminationGracePeriodSeconds {grace} < shutdown grace {shutdown} + {SHUTDOWN_MARGIN_SECS}"
        )
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

    backups = [x for x in containers(objects) if x.binary == "agentmesh-control-plane" and x.subcommand == "backup"]
    if not backups:
        problems.append(f"{c.where}: no backup job")
    db_mount = mount_for(c, sqlite_path(c.flag("--db")) or "")
    db_claim = (
        ((c.volume(db_mount["name"]) or {}).get("persistentVolumeClaim") or {}).get("claimName") if db_mount else None
    )
    for b in backups:
        if b.flag("--db") != c.flag("--db"):
            problems.append(f"{b.where}: backs up {b.flag('--db')}, the control plane uses {c.flag('--db')}")
        bm = mount_for(b, sqlite_path(b.flag("--db")) or "")
        claim = ((b.volume(bm["name"]) or {}).get("persistentVolumeClaim") or {}).get("claimName") if bm else None
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
}


def check_volumes(objects: list[dict[str, Any]]) -> list[str]:
    """Every mount has a volume; every claim, ConfigMap and Secret is rendered or external."""
    problems = []
    for c in containers(objects):
        for m in c.mounts():
            if c.volume(m["name"]) is None:
                problems.append(f"{c.where}: mount {m['mountPath']} names no volume {m['name']}")
    for w in workloads(objects):
        where = f"{w['kind']}/{w['metadata']['name']}"
        for v in (pod_template(w) or {}).get("spec", {}).get("volumes", []) or []:
            refs = []
            if "persistentVolumeClaim" in v:
                refs.append(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]))
            if "configMap" in v:
                refs.append(("ConfigMap", v["configMap"]["name"]))
            if "secret" in v:
                refs.append(("Secret", v["secret"]["secretName"]))
            for kind, name in refs:
                if find(objects, kind, name) is None and (kind, name) not in EXTERNAL_OBJECTS:
                    problems.append(f"{where}: volume {v['name']} needs {kind}/{name}, neither rendered nor documented")
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
}
