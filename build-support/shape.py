#!/usr/bin/env python3
"""The shape of Lazaret's code, measured: what each crate holds of the
non-test code, the functions over 120 lines, the files over 900 lines, the
`Result<_, String>`s, and the circles of imports between a crate's modules.

usage: build-support/shape.py [--check] [--list]

Reads the Rust sources of every workspace crate (its `src/`; `tests/`,
benches, build scripts and `#[cfg(test)]` items do not count) as text: it
strips comments, strings and character literals, then matches braces. It
prints each figure beside its target; `--list` names every function, file,
`Result<_, String>` and circle over its target; `--check` exits 1 when a
figure misses its target.
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Targets.
MAX_SHARE = 1 / 3
MAX_FN_LINES = 120
MAX_FILE_LINES = 900


def strip(text):
    """The text with comments, strings and char literals blanked out
    (newlines kept), so braces and words are code's alone."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i : j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(code, open_at):
    """The index just past the brace that closes the one at `open_at`."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def without_tests(code):
    """`code` with every `#[cfg(test)]` item blanked out."""
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]", code))):
        start = m.start()
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            end = semi + 1
        else:
            end = matching(code, brace)
        code = code[:start] + re.sub(r"[^\n]", " ", code[start:end]) + code[end:]
    return code


def lines_of(code):
    """Lines holding code."""
    return sum(1 for line in code.splitlines() if line.strip())


def functions(code):
    """(name, line, length in lines) of every function with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        # The body's brace: the first `{` at paren/angle depth 0 before a `;`.
        depth, j = 0, m.end()
        while j < len(code):
            c = code[j]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif c == ";" and depth == 0:
                j = -1
                break
            elif c == "{" and depth == 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        end = matching(code, j)
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, end) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def crates():
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    for member in manifest["workspace"]["members"]:
        if member == "tests":
            continue
        yield member, ROOT / member / "src"


def module_of(path, src):
    """The module path of a source file, as `a::b`."""
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    if parts and parts[0] == "bin":
        return None
    return "::".join(parts)


def resolve(src, parts):
    """The deepest module file among the prefixes of `parts` (`a::b::Item`
    is module `a::b` when a/b.rs exists, else `a`); "" is the crate root."""
    for k in range(len(parts), 0, -1):
        p = "/".join(parts[:k])
        if (src / f"{p}.rs").exists() or (src / p / "mod.rs").exists():
            return "::".join(parts[:k])
    return ""


def imports(src, module, code):
    """The modules `module` names through `crate::` and `super::` paths,
    each resolved as Rust does: `crate` from the root, each `super` one
    level up from `module`."""
    own = module.split("::") if module else []
    for m in re.finditer(r"\b(crate|(?:super::)*super)((?:::[a-z_][a-z0-9_]*)+)", code):
        names = m.group(2).split("::")[1:]
        if m.group(1) == "crate":
            base = []
        else:
            ups = m.group(1).count("super")
            if ups > len(own):
                continue
            base = own[: len(own) - ups]
        yield resolve(src, base + names)


def siblings(module, target):
    """The edge `module -> target` lifted to the two siblings beneath their
    closest common ancestor; None when one holds the other."""
    a = module.split("::") if module else []
    b = target.split("::") if target else []
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    if k == len(a) or k == len(b):
        return None
    return "::".join(a[: k + 1]), "::".join(b[: k + 1])


def circles(modules):
    """Strongly connected groups of two or more modules (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in modules.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in list(modules):
        if v not in index:
            visit(v)
    return out


def main():
    check = "--check" in sys.argv
    listing = "--list" in sys.argv
    share, long_fns, long_files, string_results, all_circles = {}, [], [], [], []
    for crate, src in crates():
        total = 0
        graph = {}
        for path in sorted(src.rglob("*.rs")):
            code = without_tests(strip(path.read_text()))
            n = lines_of(code)
            total += n
            rel = path.relative_to(ROOT)
            if n > MAX_FILE_LINES:
                long_files.append((str(rel), n))
            for name, line, length in functions(code):
                if length > MAX_FN_LINES:
                    long_fns.append((f"{rel}:{line}", name, length))
            for m in re.finditer(r"Result<[^;{}]*?,\s*String\s*>", code):
                string_results.append(f"{rel}:{code.count(chr(10), 0, m.start()) + 1}")
            module = module_of(path, src)
            if module is None:
                continue
            graph.setdefault(module, set())
            for target in imports(src, module, code):
                edge = siblings(module, target)
                if edge:
                    graph.setdefault(edge[0], set()).add(edge[1])
        share[crate] = total
        all_circles += [(crate, group) for group in circles(graph)]

    whole = sum(share.values())
    biggest = max(share, key=share.get)
    figures = [
        ("largest crate's share of non-test code", f"{biggest} {share[biggest] / whole:.0%}", f"<= {MAX_SHARE:.0%}", share[biggest] / whole <= MAX_SHARE),
        (f"functions over {MAX_FN_LINES} lines", str(len(long_fns)), "0", not long_fns),
        (f"files over {MAX_FILE_LINES} lines", str(len(long_files)), "0", not long_files),
        ("Result<_, String>", str(len(string_results)), "0", not string_results),
        ("import circles in a crate", str(len(all_circles)), "0", not all_circles),
    ]
    print(f"non-test code: {whole} lines; by crate: " + ", ".join(f"{c} {n} ({n / whole:.0%})" for c, n in sorted(share.items(), key=lambda kv: -kv[1])))
    for what, found, target, ok in figures:
        print(f"{'ok  ' if ok else 'MISS'} {what}: {found} (target {target})")
    if listing:
        for where, name, length in sorted(long_fns, key=lambda f: -f[2]):
            print(f"  fn {name} {length} lines at {where}")
        for where, n in sorted(long_files, key=lambda f: -f[1]):
            print(f"  file {where} {n} lines")
        for where in string_results:
            print(f"  Result<_, String> at {where}")
        for crate, group in all_circles:
            print(f"  circle in {crate}: {' -> '.join(group)}")
    if check and not all(ok for *_, ok in figures):
        sys.exit(1)


if __name__ == "__main__":
    main()
