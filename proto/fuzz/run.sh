#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECS seconds each, one after
# another, and prints per target the executions, the coverage (cov and ft
# from libFuzzer's last stats line) and the crashes.
#
#   proto/fuzz/run.sh SECS [TARGET...]
#
# Each target starts from its committed corpus (corpus/<target>, read only)
# and from what earlier runs found; new inputs go to $FUZZ_SCRATCH/<target>
# (default proto/fuzz/scratch, ignored by git), crashes to
# artifacts/<target>/. Built with debug assertions and overflow checks and
# without a sanitizer (all our code is safe Rust). Exits nonzero if a target
# crashed, or its run failed.
set -uo pipefail
cd "$(dirname "$0")"

secs=${1:?usage: run.sh SECS [TARGET...]}
shift
scratch=${FUZZ_SCRATCH:-scratch}
flags=(-a -s none)

if ! cargo +nightly fuzz --help >/dev/null 2>&1; then
    echo "error: needs a nightly toolchain and cargo-fuzz (cargo install --locked cargo-fuzz)" >&2
    exit 2
fi
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build "${flags[@]}" >&2 || exit 2

failed=0
printf '%-16s %12s %8s %8s %8s\n' target executions cov ft crashes
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "artifacts/$t" "corpus/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    log="$scratch/$t.log"
    cargo +nightly fuzz run "${flags[@]}" "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    after=$(find "artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    stats=$(grep -E '^#[0-9]+.*cov: [0-9]+' "$log" | tail -n 1)
    cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$stats")
    ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$stats")
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
    [ -n "$execs" ] || execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$stats")
    printf '%-16s %12s %8s %8s %8s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$crashes"
    if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        failed=1
        echo "  $t: exit $rc, log $log" >&2
        grep -E 'panicked at|^==[0-9]+==|Test unit written to' "$log" | head -n 5 >&2
    fi
done
exit "$failed"
