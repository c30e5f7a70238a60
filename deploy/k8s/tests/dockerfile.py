"""A small Dockerfile reader: stages, instructions, and the checks on them.

There is no Docker daemon where the tests run, so the Dockerfile is checked
for structure and for agreement with the workspace and the manifests."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from model import containers


@dataclass
class Stage:
    """One FROM ... [AS name] stage and its instructions."""

    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages of a Dockerfile (continuations joined)."""
    lines: list[str] = []
    cur = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        lines.append(cur + line)
        cur = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        if op == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            if not m:
                raise ValueError(f"cannot read FROM {rest!r}")
            image = re.sub(r"\$\{(\w+)\}", lambda v: args.get(v.group(1), v.group(0)), m.group(1))
            stages.append(Stage(image, m.group(2)))
        elif not stages:
            if op == "ARG" and "=" in rest:
                k, v = rest.split("=", 1)
                args[k.strip()] = v.strip().strip('"')
        else:
            stages[-1].instructions.append((op, rest))
    return args, stages


def workspace_bins(repo: str) -> dict[str, str]:
    """Binary name -> package name, for every workspace member."""
    with open(os.path.join(repo, "Cargo.toml"), "rb") as f:
        ws = tomllib.load(f)
    out = {}
    for member in ws["workspace"]["members"]:
        with open(os.path.join(repo, member, "Cargo.toml"), "rb") as f:
            crate = tomllib.load(f)
        for b in crate.get("bin", []):
            out[b["name"]] = crate["package"]["name"]
    return out


def workspace_features(repo: str) -> dict[str, set[str]]:
    """Package name -> its cargo features, for every workspace member."""
    with open(os.path.join(repo, "Cargo.toml"), "rb") as f:
        ws = tomllib.load(f)
    out = {}
    for member in ws["workspace"]["members"]:
        with open(os.path.join(repo, member, "Cargo.toml"), "rb") as f:
            crate = tomllib.load(f)
        out[crate["package"]["name"]] = set(crate.get("features", {}))
    return out


def feature_problems(text: str, repo: str) -> list[str]:
    """Every `CARGO_FEATURES=pkg/feature` the Dockerfile shows (the build-arg
    examples in its comments, the ARG default) names a feature that package has."""
    features = workspace_features(repo)
    problems = []
    for quoted, bare in re.findall(r'CARGO_FEATURES=(?:"([^"]*)"|(\S*))', text):
        value = quoted or bare
        for item in filter(None, re.split(r"[,\s]+", value)):
            if "/" not in item:
                problems.append(f"CARGO_FEATURES item {item!r} names no package (write package/feature)")
                continue
            pkg, feat = item.split("/", 1)
            if pkg not in features:
                problems.append(f"CARGO_FEATURES names {pkg}, which is not a workspace package")
            elif feat not in features[pkg]:
                problems.append(f"CARGO_FEATURES names {pkg}/{feat}, but {pkg} has no feature {feat}")
    return problems


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def dockerfile_problems(text: str, repo: str, rendered: list[list[dict[str, Any]]]) -> list[str]:
    """Problems with the Dockerfile, given the repo and the rendered overlays."""
    problems: list[str] = []
    args, stages = parse(text)
    if len(stages) < 2:
        return ["not multi-stage"]
    builder, runtime = stages[0], stages[-1]
    if not builder.image.startswith("rust:"):
        problems.append(f"builder is {builder.image}, expected a rust image")
    else:
        with open(os.path.join(repo, "Cargo.toml"), "rb") as f:
            need = tomllib.load(f)["workspace"]["package"]["rust-version"]
        have = builder.image.split(":", 1)[1].split("-")[0]
        if version_tuple(have) < version_tuple(need):
            problems.append(f"builder Rust {have} < workspace rust-version {need}")
    if runtime.image.startswith("rust:") or runtime.image.split(":")[0] in ("debian", "ubuntu"):
        problems.append(f"runtime image {runtime.image} is not minimal")
    users = runtime.all("USER")
    uid = users[-1].split(":")[0] if users else "0"
    if uid in ("0", "root") or not uid.isdigit():
        problems.append(f"runtime runs as {uid!r}, not a numeric non-root uid")

    problems += feature_problems(text, repo)
    runs = " ".join(builder.all("RUN"))
    if "cargo build" not in runs or "--release" not in runs or "--locked" not in runs:
        problems.append("builder does not `cargo build --release --locked`")
    packages = set(re.findall(r"-p\s+(\S+)", runs))
    bins = workspace_bins(repo)
    copied = {}
    for c in runtime.all("COPY"):
        m = re.match(r"--from=(\S+)\s+(\S+)\s+(\S+)$", c)
        if m:
            copied[m.group(3)] = m.group(2)
    for dest, src in copied.items():
        name = os.path.basename(dest)
        if name not in bins:
            problems.append(f"copies {name}, which no workspace crate builds")
        elif bins[name] not in packages:
            problems.append(f"copies {name} but does not build package {bins[name]}")
        if os.path.basename(src) != name:
            problems.append(f"copies {src} as {dest}")
    exposed = {int(p.split("/")[0]) for e in runtime.all("EXPOSE") for p in e.split()}
    for objects in rendered:
        for c in containers(objects):
            cmd = (c.spec.get("command") or [""])[0]
            if not c.binary:
                continue
            if cmd not in copied:
                problems.append(f"{c.where} runs {cmd}, which the image does not contain")
            run_as = (c.spec.get("securityContext") or {}).get(
                "runAsUser", (c.pod_spec.get("securityContext") or {}).get("runAsUser")
            )
            if str(run_as) != uid:
                problems.append(f"{c.where} runs as {run_as}, the image's user is {uid}")
            for p in c.spec.get("ports", []) or []:
                if p["containerPort"] not in exposed:
                    problems.append(f"{c.where} port {p['containerPort']} is not EXPOSEd")
    return problems
