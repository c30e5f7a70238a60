#!/usr/bin/env python3
"""Top allocation sites of a router heap profile, without Go's pprof tool.

Reads what `GET /debug/pprof/heap` returns (a gzipped pprof protobuf from
jemalloc_pprof, addresses not symbolized), symbolizes the binary's frames
with binutils' `addr2line`, and prints bytes in use per call site (the first
four frames outside the allocator and std), largest first.

usage: heap_sites.py BINARY PROFILE.pb.gz [--top=N]
  BINARY: the exact binary that was profiled (built with debuginfo, e.g.
  `cargo build --release -p agentmesh-router --features agentmesh-runtime/pprof`),
  started with `_RJEM_MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:16`
  and `--pprof-addr`.
"""
import gzip, sys, subprocess, collections, re

def varint(b, i):
    r = s = 0
    while True:
        x = b[i]; i += 1
        r |= (x & 0x7f) << s; s += 7
        if x < 0x80: return r, i

def fields(b):
    i = 0
    while i < len(b):
        k, i = varint(b, i); f, t = k >> 3, k & 7
        if t == 0: v, i = varint(b, i)
        elif t == 2:
            n, i = varint(b, i); v = b[i:i+n]; i += n
        elif t == 1: v = int.from_bytes(b[i:i+8], 'little'); i += 8
        elif t == 5: v = int.from_bytes(b[i:i+4], 'little'); i += 4
        else: raise ValueError(t)
        yield f, t, v

def packed(v, t):
    if t == 0: return [v]
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i); out.append(x)
    return out

def load(path):
    b = gzip.open(path).read()
    samples, maps, locs, strs, types = [], {}, {}, [], []
    for f, t, v in fields(b):
        if f == 1:
            d = {ff: vv for ff, _, vv in fields(v)}; types.append(d)
        elif f == 2:
            ls, vs = [], []
            for ff, tt, vv in fields(v):
                if ff == 1: ls += packed(vv, tt)
                elif ff == 2: vs += packed(vv, tt)
            samples.append((ls, vs))
        elif f == 3:
            d = {ff: vv for ff, _, vv in fields(v)}; maps[d.get(1)] = d
        elif f == 4:
            d = {ff: vv for ff, _, vv in fields(v) if ff in (1, 2, 3)}; locs[d.get(1)] = d
        elif f == 6: strs.append(v.decode())
    return samples, maps, locs, strs, types

def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    nframes = 12
    binary, prof = args[0], args[1]
    samples, maps, locs, strs, types = load(prof)
    print('types', [(strs[t.get(1,0)], strs[t.get(2,0)]) for t in types])
    binname = binary.split('/')[-1]
    def vaddr(lid):
        l = locs[lid]; m = maps.get(l.get(2))
        if not m or binname not in strs[m.get(5, 0)]: return None
        # jemalloc_pprof stores ELF virtual addresses of return sites.
        return l[3] - 1
    addrs = sorted({a for ls, _ in samples for a in map(vaddr, ls) if a is not None})
    out = subprocess.run(['addr2line', '-f', '-C', '-e', binary] + [hex(a) for a in addrs], capture_output=True, text=True).stdout.splitlines()
    sym = {a: out[2*i] for i, a in enumerate(addrs)}
    def name(lid):
        a = vaddr(lid)
        return sym.get(a, '?') if a is not None else '?lib'
    skip = re.compile(r'^(hpdata_|psset_|tcache_|rtree_|arena_|prof_|imalloc|ialloc|malloc_|alloc::|__rust|_rjem|je_|<tikv_jemalloc|core::|hashbrown::raw|std::|<alloc::|\?)')
    sites = collections.Counter(); stacks = {}
    total = 0
    for ls, vs in samples:
        bytes_ = vs[-1]; total += bytes_
        names = [name(l) for l in ls]
        keep = [n for n in names if not skip.match(n)][:nframes]
        key = ' <- '.join(keep[:4])
        sites[key] += bytes_; stacks[key] = keep
    print(f'total {total/2**20:.1f} MiB in {len(samples)} samples')
    for k, v in sites.most_common(int(next((a[6:] for a in sys.argv if a.startswith('--top=')), 25))):
        print(f'{v/2**20:7.2f} MiB  {k[:400]}')
if __name__ == "__main__": main()
