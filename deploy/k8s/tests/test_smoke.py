"""The built programs run with exactly the flags each overlay gives them.

For every overlay: the control plane starts from its container's argv (TLS,
SQLite file, admin token, every ConfigMap flag) and answers /healthz and
/readyz on the probe port; its metrics include what the alerts read; the
backup CronJob's argv makes a SQLite copy while it serves; a router started
from its StatefulSet's argv (with a router token the control plane mints)
becomes ready on its probe port and logs the watermarks tests/sizing.py
predicts for its memory limit; both exit cleanly on SIGTERM, as in a
rollout. Real processes, real TLS, real SQLite in a temp dir; waits are
bounded by deadlines, never asserted as timings. Skipped when cargo has not
built the programs (these tests never build)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

import pytest

from binaries import find_binary, missing_flags
from conftest import OVERLAYS, render
from model import addr_port, containers, parse_quantity, sqlite_path
from sizing import router_sizing
from sandbox import Sandbox, free_port, http_get, make_tls, metric_value, random_token, wait_until

READY_DEADLINE_SECS = 90
EXIT_DEADLINE_SECS = 120

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")


def program(objects, binary, subcommand=None):
    return next(c for c in containers(objects) if c.binary == binary and c.subcommand == subcommand)


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


def start_control_plane(sb, objects, files):
    cp = program(objects, "agentmesh-control-plane")
    # ConfigMaps mounted as files (the policy) come from the render itself.
    for o in objects:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] not in files:
            files[o["metadata"]["name"]] = {k: v.encode() for k, v in (o.get("data") or {}).items()}
    sb.fill_volumes(cp, files)
    argv = sb.argv(cp, "agentmesh-control-plane-0")
    argv[0] = need("agentmesh-control-plane")
    proc = sb.start(argv, "control-plane")
    ok = wait_until(ready(sb, cp), READY_DEADLINE_SECS, proc)
    assert ok, f"control plane never ready; argv {argv}\n{sb.log('control-plane')}"
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


@pytest.mark.parametrize("overlay_name", OVERLAYS)
def test_control_plane_and_backup_run_with_the_manifest_flags(sandbox, tmp_path, overlay_name):
    objects = render(overlay_name)
    cp, proc = start_control_plane(sandbox, objects, secret_files(tmp_path))

    health = http_get(probe_port(sandbox, cp, "livenessProbe"), cp.spec["livenessProbe"]["httpGet"]["path"])
    assert health and health[0] == 200
    metrics = http_get(sandbox.port(addr_port(cp.flag("--http-addr"))), "/metrics")
    assert metrics and metrics[0] == 200
    for name in (
        "agentmesh_control_plane_storage_rows",
        "agentmesh_control_plane_next_key_rotation_timestamp_seconds",
        "agentmesh_runtime_stalls_total",
    ):
        assert name in metrics[1], f"/metrics lacks {name}"

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


def mint(sandbox, cp, role):
    db = "sqlite://" + sandbox.path(sqlite_path(cp.flag("--db")) or "")
    argv = [need("agentmesh-control-plane"), "token", "create", "--db", db, "--kind", "bootstrap"]
    argv += ["--role", role, "--max-uses", "2", "--ttl-secs", "3600"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().encode()


def start_router(sandbox, tmp_path, objects):
    """Control plane, then a router from the StatefulSet's argv, both ready."""
    router = program(objects, "agentmesh-router")
    router_bin = need("agentmesh-router")
    missing = missing_flags(router_bin, None, set(router.flags()))
    assert not missing, f"agentmesh-router lacks {missing}: the StatefulSet cannot start it"
    files = secret_files(tmp_path)
    cp, cp_proc = start_control_plane(sandbox, objects, files)
    files["agentmesh-router-token"] = {"token": mint(sandbox, cp, "router")}
    sandbox.fill_volumes(router, files)
    argv = sandbox.argv(router, "agentmesh-router-0")
    argv[0] = router_bin
    proc = sandbox.start(argv, "router")
    ok = wait_until(ready(sandbox, router), READY_DEADLINE_SECS, proc)
    assert ok, f"router never ready; argv {argv}\n{sandbox.log('router')}\n{sandbox.log('control-plane')}"
    return cp, cp_proc, router, proc, argv, files


@pytest.mark.parametrize("overlay_name", OVERLAYS)
def test_router_becomes_ready_with_the_manifest_flags(sandbox, tmp_path, overlay_name):
    _, cp_proc, router, proc, argv, _ = start_router(sandbox, tmp_path, render(overlay_name))
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
    _, cp_proc, router, proc, _, _ = start_router(sandbox, tmp_path, render("overlays/dev"))
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
    cp, cp_proc, _, router_proc, _, files = start_router(sandbox, tmp_path, render("overlays/dev"))
    token = tmp_path / "member-token"
    token.write_bytes(mint(sandbox, cp, "member"))
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
