# syntax=docker/dockerfile:1
#
# One image with the three agentmesh programs: agentmesh-control-plane,
# agentmesh-router and agentmesh-node (the Kubernetes manifests pick one with
# `command`). Multi-stage: a Rust toolchain builds them, a distroless runtime
# (glibc, CA certificates, no shell, no package manager) runs them as uid
# 65532. Not built by this repository's CI (no Docker daemon there); the
# offline test (deploy/k8s/tests/test_dockerfile.py) checks its structure.
#
#   docker build -t agentmesh:dev .
#   docker build --build-arg CARGO_FEATURES="agentmesh-router/pprof agentmesh-node/pprof agentmesh-controlplane/pprof" -t agentmesh:dev .

# At least the workspace's rust-version (Cargo.toml).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# protox compiles the .proto files in Rust: no protoc needed. rusqlite
# bundles SQLite and ring builds C: the image's gcc covers both.
COPY . .
ARG CARGO_FEATURES=""
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p agentmesh-controlplane -p agentmesh-router -p agentmesh-node \
        ${CARGO_FEATURES:+--features "$CARGO_FEATURES"} \
 && mkdir -p /out \
 && cp target/release/agentmesh-control-plane \
       target/release/agentmesh-router \
       target/release/agentmesh-node /out/

# Same Debian release as the builder, so the glibc the binaries link is there.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=builder /out/agentmesh-control-plane /usr/local/bin/agentmesh-control-plane
COPY --from=builder /out/agentmesh-router /usr/local/bin/agentmesh-router
COPY --from=builder /out/agentmesh-node /usr/local/bin/agentmesh-node
# 65532 = distroless "nonroot"; the manifests run as the same uid with
# fsGroup 65532 so volumes are writable.
USER 65532:65532
# router libp2p, control plane gRPC and HTTP, router metrics.
EXPOSE 4001 7400 7401 9090
CMD ["/usr/local/bin/agentmesh-node", "--help"]
