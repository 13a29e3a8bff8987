#!/usr/bin/env python3
"""Import cycles between the workspace's source files.

An edge A -> B means file A names an item of file B's module: through a `use`,
or a path in the code (`crate::b::X`, `super::X`, `self::child::X`, `child::X`
for a child module A declares). Declaring `mod child;` is not an edge, nor is a parent's `pub use` of its own
child's item (a facade), nor anything inside a file's inline `mod tests`. Each
crate root (lib.rs, main.rs, a bin, a test or bench target) starts its own
module tree. Prints every strongly connected component of more than one file
and exits 1 if there is any.

Run from the repository's root: python3 .ci/cycles.py
"""

import re
import sys
from pathlib import Path

ROOTS = [
    "src/lib.rs",
    "src/main.rs",
    "src/bin/fake-openai.rs",
    "actors/src/lib.rs",
    "tests/e2e/main.rs",
] + [str(p) for p in sorted(Path("benches").glob("*.rs"))] + [
    str(p) for p in sorted(Path("actors/benches").glob("*.rs"))
]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(source):
    """Source without comments, string and char literals (kept as spaces)."""
    out = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
        elif source.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if source.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif source.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif re.match(r'r#*"', source[i:i + 10]) and (i == 0 or not source[i - 1].isalnum()):
            hashes = re.match(r'r(#*)"', source[i:]).group(1)
            end = source.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", source[i:i + 4] + source[i + 4:i + 12]):
            m = re.match(r"'(\\[^']*|[^\\'])'", source[i:])
            i += len(m.group(0)) if m else 1
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if start is None:
        return [tree]
    prefix, inner = tree[:start], tree[start + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    paths = []
    for part in filter(None, parts):
        for sub in expand_use(part):
            paths.append(prefix + sub if sub != "self" else prefix.rstrip(":"))
    return paths


class Crate:
    def __init__(self, root):
        self.files = {}  # module path tuple -> file
        self.inline = {}  # file -> list of (start, end, name) inline modules
        self.walk(Path(root), ())

    def walk(self, file, module):
        self.files[module] = file
        try:
            text = strip(file.read_text())
        except FileNotFoundError:
            text = ""
        self.inline[file] = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*([;{])", text):
            name = m.group(1)
            if m.group(2) == "{":
                end = matching_brace(text, m.end() - 1)
                self.inline[file].append((m.end(), end, name))
                continue
            if any(s < m.start() < e for s, e, _ in self.inline[file]):
                continue
            if file.name in ("mod.rs", "lib.rs", "main.rs") or module == ():
                base = file.parent
            else:
                base = file.parent / file.stem
            for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
                if candidate.exists():
                    self.walk(candidate, module + (name,))
                    break


def matching_brace(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        depth += text[i] == "{"
        depth -= text[i] == "}"
        if depth == 0:
            return i
    return len(text)


def resolve(crate, module, path, nested, reexports, depth=0):
    """The file a path names from `module`, following `pub use` re-exports."""
    segments = [s for s in path.split("::") if s]
    if not segments:
        return None
    children = {m[-1] for m in crate.files if len(m) == len(module) + 1 and m[:-1] == module}
    if segments[0] == "crate":
        base, rest = (), segments[1:]
    elif segments[0] in ("super", "self"):
        base = module
        while segments and segments[0] in ("super", "self"):
            if segments[0] == "super":
                if nested:
                    nested -= 1
                else:
                    base = base[:-1]
            segments = segments[1:]
        rest = segments
    elif segments[0] in children:
        base, rest = module, segments
    else:
        return None
    target = base
    for i, segment in enumerate(rest):
        if target + (segment,) in crate.files:
            target = target + (segment,)
            continue
        # An item the module only re-exports lives where the re-export points.
        via = reexports.get(target, {}).get(segment)
        if via and depth < 8:
            found = resolve(crate, target, via, 0, reexports, depth + 1)
            if found is not None:
                return found
        break
    return target


def reexports_of(crate, texts):
    """For each module, the names it re-exports (`pub use a::b::X;`) and their paths."""
    table = {}
    for module, file in crate.files.items():
        names = {}
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", texts[file]):
            for p in expand_use(m.group(1)):
                if p.endswith("*"):
                    continue
                name = re.split(r"\bas\b", p)[-1].split("::")[-1]
                target = re.split(r"\bas\b", p)[0]
                names[name] = target
        table[module] = names
    return table


def edges(crate):
    texts = {}
    for file in crate.files.values():
        try:
            texts[file] = strip(file.read_text())
        except FileNotFoundError:
            texts[file] = ""
    reexports = reexports_of(crate, texts)
    result = {}
    for module, file in crate.files.items():
        text = texts[file]
        targets = set()
        paths = []
        uses = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            uses.append((m.start(), m.end()))
            is_pub = re.search(r"\bpub(?:\([^)]*\))?\s+$", text[max(0, m.start() - 16):m.start()])
            for p in expand_use(m.group(1)):
                paths.append((m.start(), re.split(r"\bas\b", p)[0], bool(is_pub)))
        for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:crate|super|self|" + IDENT + r")(?:::(?:" + IDENT + r"|\*))+)", text):
            if not any(start <= m.start() < end for start, end in uses):
                paths.append((m.start(), m.group(1), False))
        for at, path, is_pub in paths:
            # A file's unit tests (`mod tests { … }`) may use anything.
            if any(s < at < e for s, e, name in crate.inline[file] if name == "tests"):
                continue
            # `super` inside an inline module names this file.
            nested = sum(1 for s, e, _ in crate.inline[file] if s < at < e)
            target = resolve(crate, module, path, nested, reexports)
            if target is None or target == module:
                continue
            # A parent's re-export of its own child is a facade, not a dependency.
            if is_pub and target[:len(module)] == module:
                continue
            targets.add(crate.files[target])
        targets.discard(file)
        result[file] = targets
    return result


def components(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
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
            out.append(group)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            connect(v)
    return out


def main():
    found = 0
    for root in ROOTS:
        if not Path(root).exists():
            continue
        graph = edges(Crate(root))
        for group in components(graph):
            if len(group) < 2:
                continue
            found += 1
            names = sorted(str(f) for f in group)
            print(f"cycle ({root}): " + ", ".join(names))
            for f in sorted(group, key=str):
                inside = sorted(str(t) for t in graph[f] if t in group)
                print(f"  {f} -> {', '.join(inside)}")
    if found:
        print(f"{found} import cycle(s)")
        return 1
    print("no import cycle between files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
