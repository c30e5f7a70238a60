#!/usr/bin/env bash
# $1 = variant dir name under /work/exp-bin; $2 = output dir
set -u
B=/work/exp-bin/$1; D=$2
rm -rf "$D" /work/exp-work-$1; mkdir -p "$D"
PATH=$B:$PATH $B/agentmesh-ladder local --routers 4 --member-routers 2 --providers 3 --step 1000 --steps 10 --join-rate 50 \
  --control-plane-arg=--enroll-rate-per-sec=60 --control-plane-arg=--enroll-burst=60 \
  --router-arg=--memory-limit-bytes=2147483648 --router-arg=--drain-grace-secs=60 \
  --restart-routers --hold-secs ${HOLD:-300} --kill-router-at 30 --drain-router-at 150 --after-secs ${AFTER:-90} \
  --step-deadline-secs 300 ${EXTRA:-} --work-dir /work/exp-work-$1 --report "$D/report.json" > "$D/table.md" 2> "$D/stderr.log"
echo "ladder exit $?" >> "$D/stderr.log"
