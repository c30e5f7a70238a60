#!/usr/bin/env python3
"""Fails if the top-level modules of any crate import each other in a cycle.

For every crate root (src/lib.rs, src/main.rs, src/bin/*.rs) it reads the
`mod` declarations, gathers every `crate::` path in each module's files
(`use` lines, grouped imports and paths in expressions alike, tests
included), and reports each strongly connected component of more than one
module. A crate whose concerns are layered has none. `--self-test` checks
the checker against a small crate written into a temp dir.
"""
import os, re, sys

MOD_RE = re.compile(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;', re.M)

def strip_comments(src):
    src = re.sub(r'/\*.*?\*/', '', src, flags=re.S)
    src = re.sub(r'//[^\n]*', '', src)
    return src

def use_leaves(tree):
    """(first segment, leaf name) of every path in a `use` tree such as
    `a::{b::C, d as E}`; `self` leaves name their parent."""
    out = []
    def walk(prefix, t):
        t = t.strip()
        if not t:
            return
        m = re.match(r'^(.*?)::\s*\{(.*)\}$', t, flags=re.S)
        if m:
            head = [x.strip() for x in m.group(1).split('::') if x.strip()]
            depth, cur, parts = 0, '', []
            for ch in m.group(2):
                if ch == '{': depth += 1
                elif ch == '}': depth -= 1
                if ch == ',' and depth == 0:
                    parts.append(cur); cur = ''
                else:
                    cur += ch
            parts.append(cur)
            for p in parts:
                walk(prefix + head, p)
            return
        segs = [x.strip() for x in re.split(r'\s+as\s+', t)[0].split('::') if x.strip()]
        alias = re.split(r'\s+as\s+', t)
        path = prefix + segs
        if not path:
            return
        leaf = alias[1].strip() if len(alias) > 1 else path[-1]
        if leaf == 'self' and len(path) > 1:
            leaf = path[-2]
        out.append((path[0], leaf))
    walk([], tree)
    return out

def root_reexports(root_src, mods):
    """Names the crate root re-exports from its own modules (`pub use m::X`),
    so that `crate::X` counts as a path into `m`."""
    out = {}
    for m in re.finditer(r'^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);', root_src, re.M):
        for first, leaf in use_leaves(m.group(1)):
            if first in ('crate', 'self'):
                continue
            if first in mods and leaf != '*':
                out[leaf] = first
    # `use crate::m::X` / `use self::m::X` at the root
    for m in re.finditer(r'^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+(?:crate|self)::([^;]+);', root_src, re.M):
        for first, leaf in use_leaves(m.group(1)):
            if first in mods and leaf != '*':
                out[leaf] = first
    return out

def crate_paths(src):
    """First segments of `crate::` paths, groups included."""
    out = set()
    i = 0
    for m in re.finditer(r'\bcrate\s*::\s*', src):
        j = m.end()
        if j < len(src) and src[j] == '{':
            depth, k = 0, j
            while k < len(src):
                if src[k] == '{': depth += 1
                elif src[k] == '}':
                    depth -= 1
                    if depth == 0: break
                k += 1
            inner = src[j+1:k]
            # top-level items of the group: split on commas at depth 0
            depth, cur, parts = 0, '', []
            for ch in inner:
                if ch == '{': depth += 1
                elif ch == '}': depth -= 1
                if ch == ',' and depth == 0:
                    parts.append(cur); cur = ''
                else:
                    cur += ch
            parts.append(cur)
            for p in parts:
                n = re.match(r'\s*([A-Za-z_][A-Za-z0-9_]*)', p)
                if n: out.add(n.group(1))
        else:
            n = re.match(r'([A-Za-z_][A-Za-z0-9_]*)', src[j:])
            if n: out.add(n.group(1))
    return out

def module_files(src_dir, name):
    files = []
    f = os.path.join(src_dir, name + '.rs')
    d = os.path.join(src_dir, name)
    if os.path.isfile(f): files.append(f)
    if os.path.isdir(d):
        for root, _, names in os.walk(d):
            files += [os.path.join(root, n) for n in names if n.endswith('.rs')]
    return files

def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(sorted(comp))
    for v in list(graph):
        if v not in index: visit(v)
    return out

def check_root(root_file):
    src_dir = os.path.dirname(root_file)
    root_src = strip_comments(open(root_file).read())
    mods = MOD_RE.findall(root_src)
    reexports = root_reexports(root_src, set(mods))
    graph = {}
    for m in mods:
        refs = set()
        for f in module_files(src_dir, m):
            for first in crate_paths(strip_comments(open(f).read())):
                refs.add(reexports.get(first, first))
        graph[m] = sorted((refs & set(mods)) - {m})
    return [c for c in sccs(graph) if len(c) > 1], graph

def roots(top):
    for dirpath, dirnames, names in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in ('target', '.git', 'fuzz', 'node_modules')]
        if os.path.basename(dirpath) == 'src':
            for n in ('lib.rs', 'main.rs'):
                p = os.path.join(dirpath, n)
                if os.path.isfile(p): yield p
            b = os.path.join(dirpath, 'bin')
            if os.path.isdir(b):
                for n in sorted(os.listdir(b)):
                    if n.endswith('.rs'): yield os.path.join(b, n)

def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, 'c', 'src')
        os.makedirs(os.path.join(src, 'b'))
        open(os.path.join(src, 'lib.rs'), 'w').write('mod a;\npub(crate) mod b;\nmod c;\n// mod d;\n')
        open(os.path.join(src, 'a.rs'), 'w').write('use crate::{c::X, b::{Y, Z}};\n')
        open(os.path.join(src, 'b.rs'), 'w').write('mod inner;\n')
        open(os.path.join(src, 'b', 'inner.rs'), 'w').write('fn f() { crate::a::g() }\n')
        open(os.path.join(src, 'c.rs'), 'w').write('// crate::a is only a comment\n')
        cycles, _ = check_root(os.path.join(src, 'lib.rs'))
        assert cycles == [['a', 'b']], cycles
        open(os.path.join(src, 'b', 'inner.rs'), 'w').write('fn f() {}\n')
        cycles, _ = check_root(os.path.join(src, 'lib.rs'))
        assert cycles == [], cycles
        # a path through a root re-export counts as a path into its module
        open(os.path.join(src, 'lib.rs'), 'w').write('mod a;\nmod b;\nmod c;\npub use a::{Thing as Renamed, other};\n')
        open(os.path.join(src, 'b', 'inner.rs'), 'w').write('fn f() -> crate::Renamed { todo() }\n')
        cycles, _ = check_root(os.path.join(src, 'lib.rs'))
        assert cycles == [['a', 'b']], cycles
    print('module-cycles self-test passed')

def main(argv):
    if len(argv) > 1 and argv[1] == '--self-test':
        self_test()
        return 0
    top = argv[1] if len(argv) > 1 else '.'
    bad = 0
    for r in sorted(roots(top)):
        cycles, graph = check_root(r)
        for c in cycles:
            bad += 1
            print(f'{r}: import cycle among top-level modules: {", ".join(c)}')
            for m in c:
                print(f'    {m} -> {", ".join(x for x in graph[m] if x in c)}')
    if bad:
        return 1
    print('no import cycles among top-level modules')
    return 0

if __name__ == '__main__':
    sys.exit(main(sys.argv))
