#!/bin/bash
ulimit -n 20000
cd /work/runs/h10k
/work/relbin-c6f4974/agentmesh-ladder local --hosts 9 --member-nat eim --routers 4 --member-routers 2 --providers 3 --step 1000 --steps 10 --join-rate 50 --control-plane-arg=--enroll-rate-per-sec=60 --control-plane-arg=--enroll-burst=60 --router-arg=--memory-limit-bytes=2147483648 --router-arg=--drain-grace-secs=60 --restart-routers --hold-secs 300 --kill-router-at 30 --drain-router-at 150 --after-secs 90 --step-deadline-secs 300 --work-dir /work/runs/h10k/work --report /work/runs/h10k/report.json > stdout.log 2> stderr.log
echo "rc=$?" > rc
