#!/usr/bin/env bash
# Memory shape: 3 routers, 5,000 members K=2, kill then drain (restarted), heap profiles before and after.
set -u
B=/work/target-prof/release
OUT=${OUT:-/work/prof/run1}
rm -rf "$OUT"; mkdir -p "$OUT/heap"
PPROF_ARG=""; [ "${PROF:-1}" = 1 ] && PPROF_ARG="--router-arg=--pprof-addr=127.0.0.1:0"
if [ "${PROF:-1}" = 1 ]; then export _RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:16${MCONF:+,$MCONF}
elif [ -n "${MCONF:-}" ]; then export _RJEM_MALLOC_CONF=$MCONF; fi
PATH=$B:$PATH
$B/agentmesh-ladder local --routers 3 --member-routers 2 --providers 3 --step ${STEP:-5000} --steps 1 --join-rate 60 \
  --control-plane-arg=--enroll-rate-per-sec=70 --control-plane-arg=--enroll-burst=70 \
  --router-arg=--memory-limit-bytes=2147483648 --router-arg=--drain-grace-secs=60 ${PPROF_ARG:-} \
  --restart-routers --hold-secs ${HOLD:-420} --kill-router-at ${KILL:-60} --drain-router-at ${DRAIN:-220} --after-secs ${AFTER:-150} \
  --step-deadline-secs 300 ${EXTRA:-} --work-dir "$OUT/run" --report "$OUT/report.json" > "$OUT/table.md" 2> "$OUT/stderr.log" &
LADDER=$!
grab() { # $1 label
  for i in 0 1 2; do
    a=$(grep -a "profiles on" "$OUT/run/r$i.log" 2>/dev/null | tail -1 | sed 's/\x1b\[[0-9;]*m//g' | sed -E 's/.*bound=([0-9.:]+).*/\1/')
    [ -n "$a" ] && [ "${PROF:-1}" = 1 ] && curl -s -m 60 -o "$OUT/heap/r$i-$1.pb.gz" "http://$a/debug/pprof/heap" && echo "r$i $1 $a"
    m=$(grep -a "metrics on" "$OUT/run/r$i.log" 2>/dev/null | tail -1 | sed 's/\x1b\[[0-9;]*m//g' | sed -E 's/.*metrics on (http[^ ]+).*/\1/')
    [ -n "$m" ] && curl -s -m 60 -o "$OUT/heap/r$i-$1-allocator.txt" "$m/debug/allocator"
  done
}
for t in $(seq 1 120); do sleep 1; [ "$(grep -al 'metrics on' $OUT/run/r*.log 2>/dev/null | wc -l)" = 3 ] && break; done
sleep 3; grab pre
while kill -0 $LADDER 2>/dev/null; do
  if grep -q "the fleet leaves" "$OUT/stderr.log"; then sleep $(( ${AFTER:-150} - 30 )); grab after; break; fi
  sleep 2
done
wait $LADDER; echo "ladder exit $?"
