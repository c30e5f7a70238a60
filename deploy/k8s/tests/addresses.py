"""What a router announces (--external-addr) against what it listens on and
what Kubernetes exposes.

Members and peer routers dial the external addresses the directory lists,
so each transport the router listens on (TCP; QUIC when a `/udp/N/quic-v1`
listener is added) needs an announced address with the same transport and
port, a container port of the right protocol, and a per-pod Service that
exposes it. A `/dns4` (or `/dns`, `/dns6`) address must name the host that
external-dns publishes for that pod's own Service: the router resolves it on
dial (as members do), so a name that points elsewhere, or nowhere, would
send every member to the wrong router or to no router at all.
"""

from __future__ import annotations

import re
from typing import Any

from model import Container

POD_NAME_REF = "$(POD_NAME)"
EXTERNAL_DNS_ANNOTATION = "external-dns.alpha.kubernetes.io/hostname"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"

# (transport, port) of a multiaddr: ("tcp", 4001) or ("quic-v1", 4001).
_TCP = re.compile(r"/tcp/(\d+)$")
_QUIC = re.compile(r"/udp/(\d+)/quic-v1$")
_HOST = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/([^/]+)/")
# The protocol Kubernetes must carry for each transport.
K8S_PROTOCOL = {"tcp": "TCP", "quic-v1": "UDP"}


def transport(addr: str) -> tuple[str, int] | None:
    """("tcp", port) or ("quic-v1", port), or None for anything else."""
    m = _TCP.search(addr)
    if m:
        return ("tcp", int(m.group(1)))
    m = _QUIC.search(addr)
    if m:
        return ("quic-v1", int(m.group(1)))
    return None


def _exposes(ports: list[dict[str, Any]], port: int, proto: str, c: Container | None = None) -> bool:
    for p in ports or []:
        if p.get("protocol", "TCP") != proto:
            continue
        if c is None:
            target = p.get("port")
        else:
            target = p.get("containerPort")
        if target == port:
            return True
    return False


def address_problems(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """Every listener is announced with the same transport and port, exposed by the
    container and by each pod's own Service; DNS names match each pod's Service."""
    problems: list[str] = []
    sts = c.workload
    name = sts["metadata"]["name"]
    replicas = int(sts["spec"].get("replicas", 1))
    listens = [c.expand(v) for v in c.flags().get("--listen", [])]
    externals = [c.expand(v) for v in c.flags().get("--external-addr", [])]
    if not listens or not externals:
        return [f"{c.where}: needs --listen and --external-addr (0.0.0.0 is not dialable)"]

    listened = set()
    for a in listens:
        t = transport(a)
        if t is None:
            problems.append(f"{c.where}: --listen {a} is neither /tcp/N nor /udp/N/quic-v1")
            continue
        listened.add(t)
        if not _exposes(c.spec.get("ports"), t[1], K8S_PROTOCOL[t[0]], c):
            problems.append(f"{c.where}: --listen {a} has no {K8S_PROTOCOL[t[0]]} container port {t[1]}")
    announced = {}
    for a in externals:
        t = transport(a)
        if t is None or not _HOST.match(a):
            problems.append(f"{c.where}: --external-addr {a} is not /ip4|/ip6|/dns*/HOST/tcp/N or .../udp/N/quic-v1")
            continue
        announced.setdefault(t, []).append(a)
        if t not in listened:
            problems.append(
                f"{c.where}: --external-addr {a} announces a transport and port the router does not listen on"
            )
    for t in sorted(listened - set(announced)):
        problems.append(f"{c.where}: listens on {t[0]} port {t[1]} but announces no --external-addr for it")

    for t, addrs in announced.items():
        for a in addrs:
            m = _HOST.match(a)
            if m and m.group(1).startswith("dns") and POD_NAME_REF not in m.group(2) and replicas > 1:
                problems.append(f"{c.where}: --external-addr {a} announces one name for all {replicas} pods")

    services = {
        s["spec"]["selector"][POD_NAME_LABEL]: s
        for s in objects
        if s["kind"] == "Service" and POD_NAME_LABEL in (s["spec"].get("selector") or {})
    }
    for t, addrs in sorted(announced.items()):
        proto = K8S_PROTOCOL[t[0]]
        for i in range(replicas):
            pod = f"{name}-{i}"
            svc = services.get(pod)
            if svc is None:
                continue  # check_router reports the missing Service
            where = f"Service/{svc['metadata']['name']}"
            if not _exposes(svc["spec"].get("ports"), t[1], proto):
                problems.append(f"{where}: does not expose {proto} port {t[1]} that {pod} announces")
            for a in addrs:
                kind, host = _HOST.match(a).groups()  # type: ignore[union-attr]
                if not kind.startswith("dns"):
                    continue
                host = host.replace(POD_NAME_REF, pod)
                published = {
                    h.strip().rstrip(".")
                    for h in ((svc["metadata"].get("annotations") or {}).get(EXTERNAL_DNS_ANNOTATION) or "").split(",")
                    if h.strip()
                }
                if host not in published:
                    problems.append(
                        f"{where}: {pod} announces {host}, but the Service publishes {sorted(published) or 'no name'}"
                    )
                if svc["spec"].get("type") != "LoadBalancer":
                    problems.append(
                        f"{where}: {pod} announces the DNS name {host} but the Service is not a LoadBalancer"
                    )
    return problems
