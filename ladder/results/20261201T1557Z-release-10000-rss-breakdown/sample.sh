#!/bin/bash
# every 5 s: unix time, pid, the router's --listen arg (identity), VmRSS/RssAnon/RssFile/RssShmem kB
out=./rss.tsv
while true; do
  now=$(date +%s)
  for p in $(pgrep -f 'target-prof/release/agentmesh-router'); do
    s=/proc/$p/status
    [ -r $s ] || continue
    a=$(tr '\0' ' ' < /proc/$p/cmdline | grep -o -- '--identity-file [^ ]*\|--identity[^ ]*' | head -1)
    printf '%s\t%s\t%s\t%s\n' "$now" "$p" "$a" "$(awk '/^(VmRSS|RssAnon|RssFile|RssShmem):/{printf "%s=%s ",$1,$2}' $s)"
  done >> $out
  sleep 5
done
