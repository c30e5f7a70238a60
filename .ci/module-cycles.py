#!/usr/bin/env python3
"""Fails if sibling modules of any crate import each other in a cycle, at
every depth: the top-level modules of a crate, the children of each of
them, and so on down.

For every crate root (src/lib.rs, src/main.rs, src/bin/*.rs) it follows the
`mod` declarations (files and inline `mod x { .. }` blocks), resolves every
module path in each of them (`crate::`, `super::`, `self::`, grouped
`use a::{b::C, d}` trees and paths in expressions alike, tests included;
a name a module re-exports with `pub use child::X` counts as a path into
`child`) and draws an edge between the two siblings under the closest
common ancestor of the referring and the referred module. Each strongly
connected component of more than one sibling is a cycle. Concerns that are
layered have none. Paths brought in by a glob (`use super::*`) and then
used bare are not seen. `--self-test` checks the checker against small
crates written into a temp dir.
"""
import os, re, sys

IDENT = r'[A-Za-z_][A-Za-z0-9_]*'
MOD_DECL_RE = re.compile(r'(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(' + IDENT + r')\s*(;|\{)')
PATH_ATTR_RE = re.compile(r'#\[\s*path\s*=')

# Cycles that exist today and are being cut, each exactly as found (crate
# root, parent module, members): a cycle that grows or a new one fails.
# Empty this list; never add to it.
KNOWN_CYCLES = set()


def blank(src):
    """Comments, strings and char literals replaced by spaces (newlines
    kept), so braces and paths inside them do not count."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif src.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith('/*', j): depth += 1; j += 2
                elif src.startswith('*/', j): depth -= 1; j += 2
                else: j += 1
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif (m := re.match(r'b?r(#*)"', src[i:i + 260])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
            close = '"' + m.group(1)
            j = src.find(close, i + m.end()); j = n if j < 0 else j + len(close)
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'", src[i:i + 12])
            if m: out.append(' ' * m.end()); i += m.end()
            else: out.append(c); i += 1
        else:
            out.append(c); i += 1
    return ''.join(out)


def match_brace(s, open_at):
    depth = 0
    for k in range(open_at, len(s)):
        if s[k] == '{': depth += 1
        elif s[k] == '}':
            depth -= 1
            if depth == 0: return k
    return len(s) - 1


def split_top(s, sep=','):
    depth, cur, parts = 0, '', []
    for ch in s:
        if ch == '{': depth += 1
        elif ch == '}': depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur); cur = ''
        else:
            cur += ch
    parts.append(cur)
    return parts


def tree_leaves(t):
    """Every path of a use tree such as `a::{b::C, d as E}`, as (segment
    list, name it is known by); `self` in a group names its parent."""
    t = t.strip()
    if not t:
        return []
    m = re.match(r'^(.*?)::\s*\{(.*)\}$', t, flags=re.S)
    if m or t.startswith('{'):
        head = m.group(1) if m else ''
        inner = m.group(2) if m else t[1:-1]
        head = [x.strip() for x in head.split('::') if x.strip()]
        out = []
        for p in split_top(inner):
            for sub, leaf in tree_leaves(p):
                if sub == ['self']:
                    out.append((head, leaf if leaf != 'self' else (head[-1] if head else 'self')))
                else:
                    out.append((head + sub, leaf))
        return out
    parts = re.split(r'\s+as\s+', t)
    segs = [x.strip() for x in parts[0].split('::') if x.strip()]
    if not segs:
        return []
    return [(segs, parts[1].strip() if len(parts) > 1 else segs[-1])]


def tree_paths(t):
    return [segs for segs, _ in tree_leaves(t)]


class Crate:
    def __init__(self, root_file):
        self.modules = {}      # module path (tuple) -> [(file, span start, span end)]
        self.children = {}     # module path -> set of child names
        self.reexports = {}    # module path -> {name: child}
        self.refs = []         # (from module path, target segment list)
        self.load(root_file, (), is_dir_owner=True)

    def load(self, path, modpath, is_dir_owner):
        try:
            raw = open(path, encoding='utf-8').read()
        except OSError:
            return
        src = blank(raw)
        base = os.path.dirname(path)
        if not is_dir_owner:
            base = os.path.join(base, os.path.splitext(os.path.basename(path))[0])
        self.scan(src, 0, len(src), modpath, base, path)

    def scan(self, src, start, end, modpath, base, path):
        self.children.setdefault(modpath, set())
        self.reexports.setdefault(modpath, {})
        # Inline modules first: their spans belong to them, not to us.
        inner_spans = []
        pos = start
        while True:
            m = MOD_DECL_RE.search(src, pos, end)
            if not m:
                break
            name = m.group(1)
            self.children[modpath].add(name)
            if m.group(2) == '{':
                close = match_brace(src, m.end() - 1)
                inner_spans.append((m.start(), close))
                self.scan(src, m.end(), close, modpath + (name,), os.path.join(base, name), path)
                pos = close + 1
            else:
                pos = m.end()
                if PATH_ATTR_RE.search(m.group(0)):
                    continue
                f = os.path.join(base, name + '.rs')
                d = os.path.join(base, name, 'mod.rs')
                if os.path.isfile(f):
                    self.load(f, modpath + (name,), is_dir_owner=False)
                elif os.path.isfile(d):
                    self.load(d, modpath + (name,), is_dir_owner=True)
        # Our own text: the span minus the inline modules.
        pieces, cur = [], start
        for a, b in inner_spans:
            pieces.append(src[cur:a]); cur = b + 1
        pieces.append(src[cur:end])
        text = ' '.join(pieces)
        for m in re.finditer(r'(?:^|[^A-Za-z0-9_:])(?:pub(?:\([^)]*\))?\s+)use\s+([^;]+);', text):
            for segs, leaf in tree_leaves(m.group(1)):
                s = segs[1:] if segs and segs[0] == 'self' else segs
                if len(s) >= 2 and s[0] in self.children[modpath] and leaf != '*':
                    self.reexports[modpath][leaf] = s[0]
        for m in re.finditer(r'(?:^|[^A-Za-z0-9_:])use\s+([^;]+);', text):
            for segs in tree_paths(m.group(1)):
                self.add_ref(modpath, segs)
        for m in re.finditer(r'(?<![A-Za-z0-9_:])((?:crate|self|super)(?:\s*::\s*super)*)\s*::\s*', text):
            j = m.end()
            prefix = [x.strip() for x in m.group(1).split('::')]
            if j < len(text) and text[j] == '{':
                close = match_brace(text, j)
                for segs in tree_paths(text[j:close + 1]):
                    self.add_ref(modpath, prefix + segs)
            else:
                chain = re.match(r'(' + IDENT + r'(?:\s*::\s*' + IDENT + r')*)', text[j:])
                if chain:
                    self.add_ref(modpath, prefix + [x.strip() for x in chain.group(1).split('::')])

    def add_ref(self, modpath, segs):
        if not segs:
            return
        if segs[0] == 'crate':
            target = list(segs[1:])
        elif segs[0] in ('self', 'super'):
            cur = list(modpath)
            k = 0
            if segs[0] == 'self':
                k = 1
            while k < len(segs) and segs[k] == 'super':
                if not cur:
                    return
                cur.pop(); k += 1
            target = cur + list(segs[k:])
        elif segs[0] in self.children.get(modpath, ()):
            target = list(modpath) + list(segs)
        else:
            return
        self.refs.append((modpath, target))

    def resolve(self, target):
        """The deepest module a path reaches (re-exports followed one step)."""
        cur = ()
        for seg in target:
            kids = self.children.get(cur, set())
            if seg in kids:
                cur = cur + (seg,)
            elif seg in self.reexports.get(cur, {}):
                return cur + (self.reexports[cur][seg],)
            else:
                break
        return cur

    def graphs(self):
        """parent module path -> {child: set(children it refers to)}"""
        out = {}
        for frm, target in self.refs:
            to = self.resolve(target)
            n = 0
            while n < len(frm) and n < len(to) and frm[n] == to[n]:
                n += 1
            if n < len(frm) and n < len(to):
                out.setdefault(frm[:n], {}).setdefault(frm[n], set()).add(to[n])
        return out


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

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
    for v in sorted(graph):
        if v not in index: visit(v)
    return out


def check_root(root_file):
    """[(parent module path, cycle, graph)] for one crate root."""
    crate = Crate(root_file)
    found = []
    for parent, graph in sorted(crate.graphs().items()):
        for c in sccs(graph):
            if len(c) > 1:
                found.append((parent, c, graph))
    return found


def roots(top):
    for dirpath, dirnames, names in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in ('target', '.git', 'fuzz', 'node_modules'))
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

    def crate(files):
        d = tempfile.mkdtemp()
        for rel, text in files.items():
            p = os.path.join(d, 'src', rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, 'w').write(text)
        return [(list(p), c) for p, c, _ in check_root(os.path.join(d, 'src', 'lib.rs'))]

    # Top level: grouped `use crate::{..}` and a path from a nested file.
    files = {
        'lib.rs': 'mod a;\npub(crate) mod b;\nmod c;\n// mod d;\n',
        'a.rs': 'use crate::{c::X, b::{Y, Z}};\n',
        'b.rs': 'mod inner;\n',
        'b/inner.rs': 'fn f() { crate::a::g() }\n',
        'c.rs': '// crate::a is only a comment\nconst S: &str = "crate::a::x";\n',
    }
    assert crate(files) == [([], ['a', 'b'])], crate(files)
    files['b/inner.rs'] = 'fn f() {}\n'
    assert crate(files) == [], crate(files)
    # A path through a re-export counts as a path into its module.
    files['lib.rs'] = 'mod a;\nmod b;\nmod c;\npub use a::{Thing as Renamed, other};\n'
    files['b/inner.rs'] = 'fn f() -> crate::Renamed { g() }\n'
    assert crate(files) == [([], ['a', 'b'])], crate(files)
    # Siblings one level down, through `super::` and `super::super::`.
    deep = {
        'lib.rs': 'mod r;\n',
        'r/mod.rs': 'mod budget;\nmod config;\nmod strangers;\n',
        'r/budget.rs': 'use super::config::Limits;\n',
        'r/config.rs': 'mod nested;\n',
        'r/config/nested.rs': 'fn f() { super::super::strangers::g() }\n',
        'r/strangers.rs': 'use super::{budget::B, config};\n',
    }
    assert crate(deep) == [(['r'], ['budget', 'config', 'strangers'])], crate(deep)
    deep['r/strangers.rs'] = 'fn f() {}\n'
    assert crate(deep) == [], crate(deep)
    # Inline modules (tests) count for their file's module; `self::` too.
    inline = {
        'lib.rs': 'mod x;\nmod y;\n',
        'x.rs': 'pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::y::g;\n}\n',
        'y.rs': 'pub fn g() { self::h(); crate::x::f() }\nfn h() {}\n',
    }
    assert crate(inline) == [([], ['x', 'y'])], crate(inline)
    print('module-cycles self-test passed')


def main(argv):
    if len(argv) > 1 and argv[1] == '--self-test':
        self_test()
        return 0
    top = argv[1] if len(argv) > 1 else '.'
    bad = 0
    for r in sorted(roots(top)):
        for parent, cycle, graph in check_root(r):
            if (os.path.relpath(r, top), '::'.join(parent), tuple(cycle)) in KNOWN_CYCLES:
                print(f'{r}: known cycle, being cut: {"::".join(parent)}: {", ".join(cycle)}')
                continue
            bad += 1
            where = '::'.join(parent) if parent else '(crate root)'
            print(f'{r}: import cycle among the modules of {where}: {", ".join(cycle)}')
            for m in cycle:
                print(f'    {m} -> {", ".join(sorted(x for x in graph.get(m, ()) if x in cycle))}')
    if bad:
        return 1
    print('no import cycles among sibling modules at any depth')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
