#!/usr/bin/env bash
# The member ladder (issue 5): builds release binaries, runs a local ladder and
# writes its report, table and logs under ladder/results/<UTC stamp>/.
#
#   ladder/member-ladder.sh                         # 10 x 1000 on 4 routers, 30 min hold
#   STEP=500 STEPS=4 HOLD_SECS=120 ladder/member-ladder.sh --drain-router-at 60
#   BURST=1500 STEPS=0 HOLD_SECS=0 ladder/member-ladder.sh
#
# Sizes come from the environment (defaults below); any further arguments are
# passed to `agentmesh-ladder local` as they are (events, --after-secs, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

STEP="${STEP:-1000}"
STEPS="${STEPS:-10}"
ROUTERS="${ROUTERS:-4}"
MEMBER_ROUTERS="${MEMBER_ROUTERS:-2}"
JOIN_RATE="${JOIN_RATE:-10}"
HOLD_SECS="${HOLD_SECS:-1800}"
PROVIDERS="${PROVIDERS:-3}"
BURST="${BURST:-0}"
AFTER_SECS="${AFTER_SECS:-0}"

echo "==> cargo build --release (control plane, router, ladder, hostile harness)" >&2
cargo build --release -p agentmesh-controlplane -p agentmesh-router -p agentmesh-ladder -p agentmesh-hostile

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="ladder/results/${stamp}"
mkdir -p "${out}"
git rev-parse HEAD > "${out}/commit" 2>/dev/null || true
echo "ulimit -n: $(ulimit -n); nproc: $(nproc)" > "${out}/machine"

args=(local
    --routers "${ROUTERS}" --member-routers "${MEMBER_ROUTERS}"
    --providers "${PROVIDERS}" --step "${STEP}" --steps "${STEPS}"
    --join-rate "${JOIN_RATE}" --hold-secs "${HOLD_SECS}"
    --burst "${BURST}" --after-secs "${AFTER_SECS}"
    --work-dir "${out}/run" --report "${out}/report.json"
    "$@")
echo "target/release/agentmesh-ladder ${args[*]}" > "${out}/command"
echo "==> $(cat "${out}/command")" >&2

target/release/agentmesh-ladder "${args[@]}" | tee "${out}/table.md"
echo "==> report: ${out}/report.json" >&2
