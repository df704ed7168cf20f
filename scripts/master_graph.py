#!/usr/bin/python3
"""The call graph between the master's files, and its cycles.

Usage: scripts/master_graph.py [DIR]   (default: master/ beside this script)

Run by .ci/run before the builds, and by `meson test` (suite unit, test
master_graph).

Every non-static function a .c file of DIR or of any folder below it
defines (a line that starts a
definition at column 0) is that file's; a file depends on another when it
names one of the other's functions.  Prints each file's dependencies, then
every strongly connected component of more than one file (a cycle: files
that both call into and are called by each other), and exits 1 when there
is one.  Static functions and macros are file-local or header-only and do
not count; neither do calls through function pointers.  Standard library
only.
"""
import os
import re
import sys

DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\s*\([^;]*$")
IDENT = re.compile(r"[A-Za-z_]\w*")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def sources(d):
    """The .c files of d and of every folder below it."""
    found = []
    for root, dirs, files in os.walk(d):
        dirs.sort()
        found += [os.path.join(root, f) for f in files if f.endswith(".c")]
    return sorted(found)


def strip(text):
    return STRING.sub('""', COMMENT.sub(" ", text))


def defined(text):
    names = set()
    for line in text.splitlines():
        m = DEF.match(line)
        if m and not line.startswith(("return", "else", "if", "for", "while")):
            names.add(m.group(1))
    return names


def sccs(graph):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main(argv):
    d = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "master")
    files = sources(d)
    text = {f: strip(open(f, encoding="utf-8").read()) for f in files}
    owner = {}
    for f in files:
        for name in defined(text[f]):
            owner.setdefault(name, f)
    graph = {}
    for f in files:
        used = set(IDENT.findall(text[f]))
        graph[f] = sorted({owner[n] for n in used if n in owner and owner[n] != f})
    def name(f):  # the path below DIR: rooms/file.c
        return os.path.relpath(f, d)

    for f in files:
        print(f"{name(f)}: {' '.join(name(g) for g in graph[f])}")
    cycles = [c for c in sccs(graph) if len(c) > 1]
    for c in cycles:
        print("cycle:", " ".join(name(f) for f in c))
    if not cycles:
        print("no cycle")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
