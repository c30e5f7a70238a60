#!/usr/bin/env python3
"""Self and inclusive share of CPU samples per function in a CPU profile
from `GET /debug/pprof/profile?seconds=N` (pprof-rs protobuf, symbolized in
the process).

usage: cpu_functions.py PROFILE.pb [SUBSTRING]  (SUBSTRING filters the inclusive list)
"""
import os, sys, collections
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import heap_sites as heap
b = open(sys.argv[1], 'rb').read()
samples, locs, funcs, strs = [], {}, {}, []
for f, t, v in heap.fields(b):
    if f == 2:
        ls, vs = [], []
        for ff, tt, vv in heap.fields(v):
            if ff == 1: ls += heap.packed(vv, tt)
            elif ff == 2: vs += heap.packed(vv, tt)
        samples.append((ls, vs))
    elif f == 4:
        lid, fns = None, []
        for ff, tt, vv in heap.fields(v):
            if ff == 1: lid = vv
            elif ff == 4:
                d = {a: c for a, _, c in heap.fields(vv)}; fns.append(d.get(1))
        locs[lid] = fns
    elif f == 5:
        d = {ff: vv for ff, _, vv in heap.fields(v)}; funcs[d.get(1)] = d.get(2, 0)
    elif f == 6: strs.append(v.decode(errors='replace'))
def names(lid): return [strs[funcs[f]] for f in locs.get(lid, []) if f in funcs]
selfc, incl = collections.Counter(), collections.Counter(); total = 0
for ls, vs in samples:
    n = vs[0]; total += n
    frames = [x for l in ls for x in names(l)]
    if frames: selfc[frames[0]] += n
    for x in set(frames): incl[x] += n
print('total samples', total)
pat = sys.argv[2] if len(sys.argv) > 2 else None
print('--- self'); [print(f'{v*100/total:5.1f}% {k[:160]}') for k, v in selfc.most_common(25)]
print('--- inclusive'); [print(f'{v*100/total:5.1f}% {k[:160]}') for k, v in incl.most_common(200) if not pat or pat in k][:60]
