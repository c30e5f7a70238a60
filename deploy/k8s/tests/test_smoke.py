"""The built programs run with exactly the flags each overlay gives them.

For every overlay: the control plane starts from its container's argv (TLS,
its database, admin token, every ConfigMap flag) and answers /healthz and
/readyz on the probe port; its metrics include what the alerts read. On
SQLite the backup CronJob's argv makes a copy while it serves; on
PostgreSQL two replicas from the same argv share one database and count
each other, and one that stops leaves the count. A router started from its
StatefulSet's argv (with a router token minted in the control plane's
database) becomes ready on its probe port and logs the watermarks
tests/sizing.py predicts for its memory limit; each program exits cleanly on
SIGTERM, as in a rollout. examples/sqlite-to-postgres's Job copies a
production control plane's database into PostgreSQL, where a replica of
overlays/ha-postgres starts on it. Real processes, real TLS, real SQLite in
a temp dir, a real PostgreSQL database of their own
(AGENTMESH_TEST_POSTGRES_URL, which .ci/postgres.sh sets); waits are bounded
by deadlines, never asserted as timings. Skipped when cargo has not built the
programs (these tests never build), or, for PostgreSQL, when no server is
given (a failure instead under AGENTMESH_REQUIRE_POSTGRES=1)."""

from __future__ import annotations

import glob
import os
import re
import secrets
import shutil
import signal
import subprocess
import urllib.parse

import pytest

from binaries import find_binary, missing_flags
from conftest import OVERLAYS, render
from model import addr_port, containers, parse_quantity, sqlite_path, store_kind
from sizing import router_sizing
from sandbox import Sandbox, free_port, http_get, make_tls, metric_value, random_token, wait_until

READY_DEADLINE_SECS = 90
EXIT_DEADLINE_SECS = 120
# A replica's presence is renewed every 2 s and lapses after 6 s
# (controlplane/src/replicas.rs): the count follows well within this.
REPLICAS_DEADLINE_SECS = 60

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")


def program(objects, binary, subcommand=None):
    return next(c for c in containers(objects) if c.binary == binary and c.subcommand == subcommand)


def store_of(overlay_name):
    return store_kind(program(render(overlay_name), "agentmesh-control-plane"))


SQLITE_OVERLAYS = [o for o in OVERLAYS if store_of(o) == "sqlite"]
POSTGRES_OVERLAYS = [o for o in OVERLAYS if store_of(o) == "postgres"]


def need(binary):
    path = find_binary(binary)
    if path is None:
        pytest.skip(f"{binary} is not built")
    return path


def probe_port(sb, c, probe):
    port = c.port_number(c.spec[probe]["httpGet"]["port"])
    return sb.port(port)


def ready(sb, c):
    path = c.spec["readinessProbe"]["httpGet"]["path"]
    return lambda: (http_get(probe_port(sb, c, "readinessProbe"), path) or (0, ""))[0] == 200


def start_control_plane(sb, objects, files, pod="agentmesh-control-plane-0", log="control-plane"):
    cp = program(objects, "agentmesh-control-plane")
    # ConfigMaps mounted as files (the policy) come from the render itself.
    for o in objects:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] not in files:
            files[o["metadata"]["name"]] = {k: v.encode() for k, v in (o.get("data") or {}).items()}
    sb.fill_volumes(cp, files)
    argv = sb.argv(cp, pod, files)
    argv[0] = need("agentmesh-control-plane")
    proc = sb.start(argv, log, {**sb.secret_env(cp, files), "HOSTNAME": pod})
    ok = wait_until(ready(sb, cp), READY_DEADLINE_SECS, proc)
    assert ok, f"control plane never ready; argv {argv}\n{sb.log(log)}"
    return cp, proc


def stop(sb, proc, name):
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=EXIT_DEADLINE_SECS)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{name} did not exit on SIGTERM\n{sb.log(name)}")
    assert rc == 0, f"{name} exited {rc} on SIGTERM\n{sb.log(name)}"


@pytest.fixture
def sandbox(tmp_path):
    sb = Sandbox(str(tmp_path))
    yield sb
    sb.stop_all()


def secret_files(tmp_path):
    tls = make_tls(str(tmp_path))
    return {
        "agentmesh-control-plane-tls": {"tls.crt": tls["tls.crt"], "tls.key": tls["tls.key"]},
        "agentmesh-control-plane-ca": {"ca.crt": tls["ca.crt"]},
        "agentmesh-admin-token": {"token": random_token()},
    }


def psql():
    found = shutil.which("psql") or sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@pytest.fixture
def postgres_url():
    """A new, empty database on AGENTMESH_TEST_POSTGRES_URL's server (dropped
    afterwards); skipped without a server, failed under AGENTMESH_REQUIRE_POSTGRES=1."""
    admin = os.environ.get("AGENTMESH_TEST_POSTGRES_URL")
    why = None if admin else "no PostgreSQL server: set AGENTMESH_TEST_POSTGRES_URL (.ci/postgres.sh does)"
    client = psql()
    if why is None and client is None:
        why = "psql not found (Debian package postgresql-client)"
    if why is not None:
        if os.environ.get("AGENTMESH_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"AGENTMESH_REQUIRE_POSTGRES=1: {why}")
        pytest.skip(why)
    name = "k8s_" + secrets.token_hex(6)

    def sql(statement):
        out = subprocess.run(
            [client, admin, "-v", "ON_ERROR_STOP=1", "-c", statement], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, f"psql {statement!r}: {out.stderr}"

    sql(f"CREATE DATABASE {name}")
    yield urllib.parse.urlsplit(admin)._replace(path="/" + name).geturl()
    sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def postgres_files(url):
    """Secrets agentmesh-control-plane-db (the test server trusts local
    connections: the password is not checked) and agentmesh-key-encryption-key."""
    return {
        "agentmesh-control-plane-db": {"url": url.encode(), "password": random_token()},
        "agentmesh-key-encryption-key": {"key": secrets.token_hex(32).encode()},
    }


@pytest.mark.parametrize("overlay_name", SQLITE_OVERLAYS)
def test_control_plane_and_backup_run_with_the_manifest_flags(sandbox, tmp_path, overlay_name):
    objects = render(overlay_name)
    cp, proc = start_control_plane(sandbox, objects, secret_files(tmp_path))
    check_probes_and_metrics(sandbox, cp)

    backup = program(objects, "agentmesh-control-plane", "backup")
    sandbox.fill_volumes(backup, {})
    argv = sandbox.argv(backup, "agentmesh-control-plane-backup-29000000-abcde")
    argv[0] = need("agentmesh-control-plane")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, f"{argv}\n{out.stderr}"
    copy = next(a.split("=", 1)[1] for a in argv if a.startswith("--to="))
    with open(copy, "rb") as f:
        assert f.read(16) == b"SQLite format 3\x00"

    stop(sandbox, proc, "control-plane")


def check_probes_and_metrics(sb, cp):
    health = http_get(probe_port(sb, cp, "livenessProbe"), cp.spec["livenessProbe"]["httpGet"]["path"])
    assert health and health[0] == 200
    metrics = http_get(sb.port(addr_port(cp.flag("--http-addr"))), "/metrics")
    assert metrics and metrics[0] == 200
    for name in (
        "agentmesh_control_plane_storage_rows",
        "agentmesh_control_plane_next_key_rotation_timestamp_seconds",
        "agentmesh_runtime_stalls_total",
    ):
        assert name in metrics[1], f"/metrics lacks {name}"


def live_replicas(sb, cp):
    metrics = http_get(sb.port(addr_port(cp.flag("--http-addr"))), "/metrics")
    return metric_value(metrics[1], "agentmesh_control_plane_live_replicas") if metrics else None


@pytest.mark.parametrize("overlay_name", POSTGRES_OVERLAYS)
def test_replicas_share_one_postgres_database_with_the_manifest_flags(tmp_path, postgres_url, overlay_name):
    """Two replicas from the same argv (each in a sandbox of its own: its own
    ports, as its own pod) on one database: both ready, each counts two; one
    stopped with SIGTERM exits cleanly and the other counts one."""
    objects = render(overlay_name)
    need("agentmesh-control-plane")
    files = {**secret_files(tmp_path), **postgres_files(postgres_url)}
    a, b = Sandbox(str(tmp_path / "a")), Sandbox(str(tmp_path / "b"))
    try:
        cp, proc_a = start_control_plane(a, objects, dict(files), "agentmesh-control-plane-a")
        _, proc_b = start_control_plane(b, objects, dict(files), "agentmesh-control-plane-b")
        check_probes_and_metrics(a, cp)
        for sb in (a, b):
            ok = wait_until(lambda sb=sb: live_replicas(sb, cp) == 2, REPLICAS_DEADLINE_SECS, proc_a)
            assert ok, f"live replicas {live_replicas(sb, cp)}, want 2\n{sb.log('control-plane')}"
        stop(b, proc_b, "control-plane")
        ok = wait_until(lambda: live_replicas(a, cp) == 1, REPLICAS_DEADLINE_SECS, proc_a)
        assert ok, f"live replicas {live_replicas(a, cp)} after one stopped, want 1\n{a.log('control-plane')}"
        stop(a, proc_a, "control-plane")
    finally:
        a.stop_all()
        b.stop_all()


def test_store_copy_job_moves_production_onto_the_postgres_overlay(tmp_path, postgres_url):
    """The migration the README describes: production's control plane (SQLite)
    serves and stops; examples/sqlite-to-postgres's Job, on its data volume,
    copies the database into PostgreSQL; a replica of overlays/ha-postgres
    starts on the copy (its signing keys open with the replicas' key)."""
    cp_bin = need("agentmesh-control-plane")
    files = {**secret_files(tmp_path), **postgres_files(postgres_url)}
    old, new = Sandbox(str(tmp_path / "sqlite")), Sandbox(str(tmp_path / "postgres"))
    try:
        cp, proc = start_control_plane(old, render("overlays/production"), dict(files))
        db = "sqlite://" + old.path(sqlite_path(cp.flag("--db")) or "")
        out = subprocess.run(
            [cp_bin, "token", "create", "--db", db, "--kind", "bootstrap", "--role", "member"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        stop(old, proc, "control-plane")

        job = program(render("examples/sqlite-to-postgres"), "agentmesh-control-plane", "store copy")
        old.fill_volumes(job, files)
        argv = old.argv(job, "agentmesh-store-copy-abcde", files)
        argv[0] = cp_bin
        env = {**os.environ, **old.secret_env(job, files)}
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
        assert out.returncode == 0, f"{argv}\n{out.stderr}"
        assert re.search(r"copied [1-9]\d* rows of tokens", out.stderr), out.stderr

        replica, proc = start_control_plane(new, render("overlays/ha-postgres"), dict(files))
        assert live_replicas(new, replica) is not None
        stop(new, proc, "control-plane")
    finally:
        old.stop_all()
        new.stop_all()


def mint(sandbox, cp, role, files):
    """A token minted straight into the control plane's database (`--db`)."""
    if store_kind(cp) == "sqlite":
        db = "sqlite://" + sandbox.path(sqlite_path(cp.flag("--db")) or "")
    else:
        argv = sandbox.argv(cp, "agentmesh-control-plane-0", files)
        db = next(a.split("=", 1)[1] for a in argv if a.startswith("--db="))
    argv = [need("agentmesh-control-plane"), "token", "create", "--db", db, "--kind", "bootstrap"]
    argv += ["--role", role, "--max-uses", "2", "--ttl-secs", "3600"]
    env = {**os.environ, **sandbox.secret_env(cp, files)}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().encode()


def start_router(sandbox, tmp_path, objects, files):
    """Control plane, then a router from the StatefulSet's argv, both ready."""
    router = program(objects, "agentmesh-router")
    router_bin = need("agentmesh-router")
    missing = missing_flags(router_bin, None, set(router.flags()))
    assert not missing, f"agentmesh-router lacks {missing}: the StatefulSet cannot start it"
    files = {**secret_files(tmp_path), **files}
    cp, cp_proc = start_control_plane(sandbox, objects, files)
    files["agentmesh-router-token"] = {"token": mint(sandbox, cp, "router", files)}
    sandbox.fill_volumes(router, files)
    argv = sandbox.argv(router, "agentmesh-router-0")
    argv[0] = router_bin
    proc = sandbox.start(argv, "router")
    ok = wait_until(ready(sandbox, router), READY_DEADLINE_SECS, proc)
    assert ok, f"router never ready; argv {argv}\n{sandbox.log('router')}\n{sandbox.log('control-plane')}"
    return cp, cp_proc, router, proc, argv, files


@pytest.mark.parametrize("overlay_name", OVERLAYS)
def test_router_becomes_ready_with_the_manifest_flags(request, sandbox, tmp_path, overlay_name):
    files = {}
    if store_of(overlay_name) == "postgres":
        need("agentmesh-router")
        need("agentmesh-control-plane")
        files = postgres_files(request.getfixturevalue("postgres_url"))
    _, cp_proc, router, proc, argv, _ = start_router(sandbox, tmp_path, render(overlay_name), files)
    metrics = http_get(probe_port(sandbox, router, "readinessProbe"), "/metrics")
    assert metrics and metric_value(metrics[1], "agentmesh_router_ready") == 1
    assert "agentmesh_router_refused_total{" in metrics[1], "refusal counters are pre-created"
    assert os.path.isfile(next(a.split("=", 1)[1] for a in argv if a.startswith("--key-path=")))
    # The offline checks size routers with sizing.py's mirror of the router's
    # rule: the real router, given this overlay's memory limit, must derive
    # the same watermarks and reservation cap (it logs them at start).
    limit = int(parse_quantity(router.spec["resources"]["limits"]["memory"]))
    want = router_sizing(limit, router.flag)
    got = logged_sizing(sandbox.log("router"))
    assert got == (want.high, want.low, want.reservations), f"router logged {got}, the offline model says {want}"
    stop(sandbox, proc, "router")
    stop(sandbox, cp_proc, "control-plane")


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def logged_sizing(log):
    """(high, low, reservations) from the router's `watermarks` start-up line."""
    for line in ANSI.sub("", log).splitlines():
        if "watermarks" in line and "high_watermark=" in line:
            fields = dict(re.findall(r"(\w+)=(\d+)", line))
            return tuple(int(fields[k]) for k in ("high_watermark", "low_watermark", "relay_max_reservations"))
    return None


def test_post_drain_on_the_probe_port_makes_the_router_unready(sandbox, tmp_path):
    """What a rollout relies on: draining takes the router out of readiness (so
    Kubernetes stops sending it new members) and SIGTERM still ends it cleanly."""
    _, cp_proc, router, proc, _, _ = start_router(sandbox, tmp_path, render("overlays/dev"), {})
    port = probe_port(sandbox, router, "readinessProbe")
    answer = http_get(port, "/drain", method="POST")
    assert answer and answer[0] == 202, answer
    assert wait_until(lambda: not ready(sandbox, router)(), READY_DEADLINE_SECS, proc), "still ready while draining"
    metrics = http_get(port, "/metrics")
    assert metrics and metric_value(metrics[1], "agentmesh_router_ready") == 0
    stop(sandbox, proc, "router")
    stop(sandbox, cp_proc, "control-plane")


def test_member_gets_ready_through_the_dev_router(sandbox, tmp_path):
    """Dev announces the router at its pod IP (here 127.0.0.1): a member dials it.
    (Production announces /dns4 names that only its DNS resolves: checks.py
    compares them with what each pod's Service publishes.)"""
    cp, cp_proc, _, router_proc, _, files = start_router(sandbox, tmp_path, render("overlays/dev"), {})
    token = tmp_path / "member-token"
    token.write_bytes(mint(sandbox, cp, "member", files))
    ca = tmp_path / "ca.crt"
    ca.write_bytes(files["agentmesh-control-plane-ca"]["ca.crt"])
    metrics_port = free_port()
    argv = [need("agentmesh-node"), "run", "--control-plane", cp.flag("--public-url") or ""]
    argv[-1] = sandbox.remap(argv[-1])
    argv += ["--control-plane-ca", str(ca), "--token-file", str(token), "--data-dir", str(tmp_path / "node")]
    argv += ["--routers", "1", "--metrics-addr", f"127.0.0.1:{metrics_port}", "--no-socket"]
    node = sandbox.start(argv, "node")
    ok = wait_until(lambda: (http_get(metrics_port, "/readyz") or (0, ""))[0] == 200, READY_DEADLINE_SECS, node)
    assert ok, f"member never ready; argv {argv}\n{sandbox.log('node')}\n{sandbox.log('router')}"
    stop(sandbox, node, "node")
    stop(sandbox, router_proc, "router")
    stop(sandbox, cp_proc, "control-plane")
