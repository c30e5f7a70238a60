#!/usr/bin/env python3
"""Fails on any non-test function longer than 120 lines or struct with more
than 20 fields, other than command-line argument structs (clap `Parser`,
`Args`, `Subcommand`): the places where every change lands grow until they
are split, and this keeps them from growing back.

Test code is exempt: files under a `tests/` directory, files named
`tests.rs` or `tests_*.rs`, `#[cfg(test)]` modules and `#[test]` functions.
A function's length counts the lines from its `fn` to its closing brace.
`--self-test` checks the checker against sources written into a temp dir.

Usage: size-limits.py [--self-test] [ROOT] [--list]
"""
import os, re, sys, tempfile

MAX_FN_LINES = 120
MAX_STRUCT_FIELDS = 20
SKIP_DIRS = {'target', '.git', 'node_modules', 'fuzz', 'k8s-venv'}
CLI_DERIVES = ('Parser', 'Args', 'Subcommand')

# Over the limits today and being split, each by file and name: it may not
# grow new company. Empty this list; never add to it.
KNOWN = set()


def blank_out(src):
    """The source with comments, strings and char literals replaced by
    spaces (newlines kept), so braces and keywords inside them vanish."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
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
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'", src[i:i + 12])
            if m:
                out.append(' ' * m.end()); i += m.end()
            else:
                out.append(c); i += 1
        else:
            out.append(c); i += 1
    return ''.join(out)


def match_brace(s, open_at):
    depth = 0
    for k in range(open_at, len(s)):
        if s[k] == '{': depth += 1
        elif s[k] == '}':
            depth -= 1
            if depth == 0:
                return k
    return len(s) - 1


def test_spans(s):
    """Character spans of `#[cfg(test)]` items and `#[test]` functions."""
    spans = []
    for m in re.finditer(r'#\[\s*(cfg\s*\(\s*test\s*\)|test|tokio::test[^\]]*)\s*\]', s):
        j = s.find('{', m.end())
        semi = s.find(';', m.end())
        if j < 0 or (0 <= semi < j and 'mod' in s[m.end():semi]):
            continue  # `#[cfg(test)] mod tests;`: the file is exempt by name.
        spans.append((m.start(), match_brace(s, j)))
    return spans


def in_spans(pos, spans):
    return any(a <= pos <= b for a, b in spans)


def line_of(s, pos):
    return s.count('\n', 0, pos) + 1


def check_source(path, src):
    s = blank_out(src)
    tests = test_spans(s)
    problems = []
    for m in re.finditer(r'\bfn\s+([A-Za-z_][A-Za-z0-9_]*)', s):
        if in_spans(m.start(), tests):
            continue
        # The body starts at the first `{` after the signature; a `;`
        # first means a declaration without a body (trait item).
        j = m.end()
        depth = 0
        body = None
        while j < len(s):
            ch = s[j]
            if ch in '(<[': depth += 1
            elif ch in ')>]': depth -= 1
            elif ch == ';' and depth <= 0: break
            elif ch == '{' and depth <= 0:
                body = j; break
            j += 1
        if body is None:
            continue
        end = match_brace(s, body)
        lines = line_of(s, end) - line_of(s, m.start()) + 1
        if lines > MAX_FN_LINES:
            problems.append((path, line_of(s, m.start()), f'fn {m.group(1)} is {lines} lines (max {MAX_FN_LINES})'))
    for m in re.finditer(r'\bstruct\s+([A-Za-z_][A-Za-z0-9_]*)[^;{(]*\{', s):
        if in_spans(m.start(), tests):
            continue
        head = s[max(0, m.start() - 400):m.start()]
        derives = re.findall(r'#\[\s*derive\s*\(([^)]*)\)\s*\]', head.split('}')[-1].split(';')[-1])
        if any(d.strip().split('::')[-1] in CLI_DERIVES for ds in derives for d in ds.split(',')):
            continue
        open_at = m.end() - 1
        end = match_brace(s, open_at)
        body = s[open_at + 1:end]
        depth, fields, cur = 0, 0, ''
        for ch in body:
            if ch in '{(<[': depth += 1
            elif ch in '})>]': depth -= 1
            if ch == ',' and depth == 0:
                if ':' in cur: fields += 1
                cur = ''
            else:
                cur += ch
        if ':' in cur.strip(): fields += 1
        if fields > MAX_STRUCT_FIELDS:
            problems.append((path, line_of(s, m.start()), f'struct {m.group(1)} has {fields} fields (max {MAX_STRUCT_FIELDS})'))
    return problems


def exempt_file(rel):
    parts = rel.split(os.sep)
    name = parts[-1]
    return 'tests' in parts[:-1] or name == 'tests.rs' or name.startswith('tests_') or 'benches' in parts[:-1]


def test_module_files(full, src):
    """Files of the modules `full` declares as `#[cfg(test)] mod name;`
    (also `cfg(any(test, ...))`): test code by declaration."""
    base = os.path.dirname(full)
    stem = os.path.splitext(os.path.basename(full))[0]
    if stem not in ('mod', 'lib', 'main'):
        base = os.path.join(base, stem)
    out = set()
    for m in re.finditer(r'#\[\s*cfg\s*\(([^\]]*)\)\s*\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;', src):
        if re.search(r'\btest\b', m.group(1)):
            out.add(os.path.normpath(os.path.join(base, m.group(2) + '.rs')))
            out.add(os.path.normpath(os.path.join(base, m.group(2), 'mod.rs')))
    return out


def scan(root):
    problems = []
    sources = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith('.'))
        for f in sorted(filenames):
            if f.endswith('.rs'):
                full = os.path.normpath(os.path.join(dirpath, f))
                with open(full, encoding='utf-8') as fh:
                    sources[full] = fh.read()
    declared_tests = set()
    for full, src in sources.items():
        declared_tests |= test_module_files(full, blank_out(src))
    for full in sorted(sources):
        rel = os.path.relpath(full, root)
        if exempt_file(rel) or full in declared_tests:
            continue
        problems += check_source(rel, sources[full])
    return problems


def self_test():
    long_body = '\n'.join(f'    let x{i} = "{{ }}"; // {{' for i in range(125))
    short_body = '\n'.join(f'    let x{i} = {i};' for i in range(10))
    fields = '\n'.join(f'    f{i}: Vec<(u8, u8)>,' for i in range(21))
    few = '\n'.join(f'    f{i}: u8,' for i in range(20))
    files = {
        'a/src/lib.rs': f"fn long() {{\n{long_body}\n}}\nfn short() {{\n{short_body}\n}}\n"
                         f"struct Big {{\n{fields}\n}}\nstruct Ok20 {{\n{few}\n}}\n"
                         f"#[derive(Debug, clap::Parser)]\nstruct Cli {{\n{fields}\n}}\n"
                         f"#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{long_body}\n    }}\n    struct T {{\n{fields}\n    }}\n}}\n"
                         "fn lifetimes<'a>(x: &'a str) -> char { let _ = '{'; 'x' }\n"
                         "trait T { fn decl(&self); }\n",
        'a/src/tests.rs': f"fn long() {{\n{long_body}\n}}\n",
        'a/tests/it.rs': f"fn long() {{\n{long_body}\n}}\n",
        'a/src/m/mod.rs': "#[cfg(test)]\nmod suite;\n#[cfg(any(test, feature = \"x\"))]\npub mod kit;\n",
        'a/src/m/suite.rs': f"fn long() {{\n{long_body}\n}}\n",
        'a/src/m/kit.rs': f"fn long() {{\n{long_body}\n}}\n",
    }
    with tempfile.TemporaryDirectory() as d:
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, 'w') as fh:
                fh.write(text)
        got = sorted(msg.split(' is ')[0].split(' has ')[0] for _, _, msg in scan(d))
    want = ['fn long', 'struct Big']
    if got != want:
        print(f'self-test failed: found {got}, expected {want}', file=sys.stderr)
        sys.exit(1)
    print('size-limits self-test: ok')


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    if '--self-test' in sys.argv:
        self_test()
        if not args:
            return
    root = args[0] if args else '.'
    problems = []
    for path, line, msg in scan(root):
        name = msg.split(' ')[1]
        if (path, name) in KNOWN:
            continue
        problems.append((path, line, msg))
    for path, line, msg in problems:
        print(f'{path}:{line}: {msg}')
    if problems:
        print(f'{len(problems)} over the size limits (functions ≤ {MAX_FN_LINES} lines, structs ≤ {MAX_STRUCT_FIELDS} fields)', file=sys.stderr)
        sys.exit(1)
    print(f'size limits: ok ({len(KNOWN)} known places still over, being split)')


if __name__ == '__main__':
    main()
