"""Runs a manifest's container as a local process: same program, same flags.

The argv is built from the rendered container exactly as the kubelet would
(env from ConfigMaps and the downward API, $(VAR) expansion), then moved onto
this machine: mount paths under a temp dir, listen ports to free loopback
ports, URLs to https://localhost. Secret and ConfigMap volumes are filled
from the manifests' own volume definitions (items, TLS keys), so a file the
manifest names but does not mount would be missing here too."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import time
from typing import Callable

from model import VAR_REF, Container, parse_quantity

# Mount points the manifests use, moved under the sandbox root.
MOUNT_PREFIXES = ("/var/lib/agentmesh", "/etc/agentmesh", "/backup", "/tmp")


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 3.0, method: str = "GET") -> tuple[int, str] | None:
    """(status, body) of METHOD http://127.0.0.1:port/path, or None when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            s.sendall(head.encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(m.group(1)), body.decode(errors="replace")) if m else None


def wait_until(pred: Callable[[], bool], deadline_secs: float, proc: subprocess.Popen | None = None) -> bool:
    """Polls `pred` until it holds, the deadline passes, or `proc` exits."""
    end = time.monotonic() + deadline_secs
    while time.monotonic() < end:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            return pred()
        time.sleep(0.2)
    return False


class Sandbox:
    """A temp root holding the mounted files, and the port mapping shared by programs."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.ports: dict[int, int] = {}
        self.procs: list[subprocess.Popen] = []

    def port(self, container_port: int) -> int:
        if container_port not in self.ports:
            self.ports[container_port] = free_port()
        return self.ports[container_port]

    def path(self, path: str) -> str:
        return self.root + path

    def remap(self, value: str) -> str:
        """Moves one expanded argument onto this machine."""
        value = re.sub(r"https://[^/:]+:(\d+)", lambda m: f"https://localhost:{self.port(int(m.group(1)))}", value)
        value = re.sub(r"0\.0\.0\.0:(\d+)", lambda m: f"127.0.0.1:{self.port(int(m.group(1)))}", value)
        value = value.replace("/ip4/0.0.0.0/", "/ip4/127.0.0.1/")
        value = re.sub(r"/tcp/(\d+)", lambda m: f"/tcp/{self.port(int(m.group(1)))}", value)
        prefixes = "|".join(re.escape(p) for p in MOUNT_PREFIXES)
        return re.sub(rf"(^|=|sqlite://)({prefixes})(?=/|$)", lambda m: m.group(1) + self.root + m.group(2), value)

    def secret_env(self, c: Container, files: dict[str, dict[str, bytes]]) -> dict[str, str]:
        """The container's env items read from Secrets (`secretKeyRef`), from
        `files[secret][key]`, as the kubelet puts them in the process's env."""
        out = {}
        for e in c.spec.get("env", []) or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref and ref["key"] in files.get(ref["name"], {}):
                out[e["name"]] = files[ref["name"]][ref["key"]].decode()
        return out

    def argv(self, c: Container, pod_name: str, files: dict[str, dict[str, bytes]] | None = None) -> list[str]:
        """The container's command and args, expanded (Secrets' values from
        `files`) and remapped."""
        env = {k: v for k, v in c.env_values.items() if v is not None}
        env.update(self.secret_env(c, files or {}))
        for e in c.spec.get("env", []) or []:
            ref = e.get("valueFrom") or {}
            if (ref.get("fieldRef") or {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = pod_name
            elif (ref.get("fieldRef") or {}).get("fieldPath") == "status.podIP":
                env[e["name"]] = "127.0.0.1"
            elif "resourceFieldRef" in ref:
                res = ref["resourceFieldRef"]
                kind, _, what = res["resource"].partition(".")
                value = parse_quantity(c.spec["resources"][kind][what]) / parse_quantity(res.get("divisor", "1"))
                env[e["name"]] = str(int(value))
        # A second pass resolves env values that referred to downward-API vars.
        for e in c.spec.get("env", []) or []:
            if "value" in e:
                env[e["name"]] = VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))

        def expand(s: str) -> str:
            return VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), s)

        cmd = [expand(str(x)) for x in (c.spec.get("command") or [])]
        args = [self.remap(expand(str(x))) for x in (c.spec.get("args") or [])]
        return cmd + args

    def fill_volumes(self, c: Container, files: dict[str, dict[str, bytes]]) -> None:
        """Creates each mount dir; writes Secret/ConfigMap keys from `files[name][key]`
        (a `subPath` mount is the one file of that key)."""
        for m in c.mounts():
            target = self.path(m["mountPath"])
            vol = c.volume(m["name"]) or {}
            if m.get("subPath"):
                src = vol.get("secret") or vol.get("configMap") or {}
                data = files.get(src.get("secretName") or src.get("name"), {})
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if m["subPath"] in data:
                    with open(target, "wb") as f:
                        f.write(data[m["subPath"]])
                    os.chmod(target, 0o600)
                continue
            os.makedirs(target, exist_ok=True)
            src = vol.get("secret") or vol.get("configMap")
            if not src:
                continue
            name = src.get("secretName") or src.get("name")
            data = files.get(name, {})
            items = src.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] in data:
                    with open(os.path.join(target, item["path"]), "wb") as f:
                        f.write(data[item["key"]])
                    os.chmod(os.path.join(target, item["path"]), 0o600)

    def start(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts a program, logging to the sandbox; `env` adds to the environment."""
        log = open(os.path.join(self.root, log_name + ".log"), "wb")  # noqa: SIM115 (closed with the process)
        env = {**os.environ, "RUST_LOG": "info", **(env or {})}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def log(self, log_name: str) -> str:
        try:
            with open(os.path.join(self.root, log_name + ".log"), encoding="utf-8", errors="replace") as f:
                return f.read()[-6000:]
        except OSError:
            return ""

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def make_tls(root: str) -> dict[str, bytes]:
    """A throwaway CA and a server certificate for localhost (openssl CLI)."""
    d = os.path.join(root, "pki")
    os.makedirs(d, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.crt")
    run("req", *ec, "-subj", "/CN=localhost", "-keyout", "tls.key", "-out", "tls.csr")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "san.ext", "-out", "tls.crt")  # fmt: skip

    def read(name: str) -> bytes:
        with open(os.path.join(d, name), "rb") as f:
            return f.read()

    return {"tls.crt": read("tls.crt"), "tls.key": read("tls.key"), "ca.crt": read("ca.crt")}


def random_token() -> bytes:
    return secrets.token_urlsafe(32).encode()


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample `name` in Prometheus text."""
    m = re.search(rf"^{re.escape(name)}(?:\{{\}})? (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None
