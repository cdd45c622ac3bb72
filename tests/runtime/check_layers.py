"""The code's layers hold: bench -> runtime -> gen -> templates, never back up,
and no two files of the libraries include or call each other in a loop.

    check_layers.py SOURCE_DIR BUILD_DIR

Includes are read from the sources (#include "..."); calls from the objects
the build made (nm: the symbols each one uses and defines). Exit 1 naming
every include up the layers and every loop.
"""

import os
import re
import subprocess
import sys

LAYERS = ["templates", "gen", "runtime", "bench"]  # each may use those before it
OBJECTS = {"gen": "CMakeFiles/klgen_obj.dir/gen", "runtime": "runtime/CMakeFiles/klrt_obj.dir"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(src):
    for layer in LAYERS:
        for root, _, files in os.walk(os.path.join(src, layer)):
            for f in files:
                if f.endswith((".c", ".h", ".tmpl", ".cu")):
                    yield layer, os.path.join(root, f)


def header_layer(src, name, here):
    """The layer whose directory holds the header `name`, or None (a system or
    third-party header)."""
    if os.path.exists(os.path.join(os.path.dirname(here), name)):
        return os.path.relpath(here, src).split(os.sep)[0]
    for layer in LAYERS:
        for root, _, files in os.walk(os.path.join(src, layer)):
            if os.path.basename(name) in files and os.path.join(root, name).endswith(name):
                return layer
    return None


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def symbols(obj):
    """(defined, used) global symbols of an object."""
    text = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRC":
            defined.add(parts[2])
    return defined, used


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: check_layers.py SOURCE_DIR BUILD_DIR")
    src, build = argv[1], argv[2]
    fails = checked = 0
    includes = {}
    for layer, path in sources(src):
        with open(path, errors="replace") as f:
            text = f.read()
        rel = os.path.relpath(path, src)
        for name in INCLUDE.findall(text):
            target = header_layer(src, name, path)
            checked += 1
            if target and LAYERS.index(target) > LAYERS.index(layer):
                print(f"FAIL: {rel} includes {name}, of {target}, a layer above {layer}")
                fails += 1
            if target:
                includes.setdefault(rel, set()).add(os.path.basename(name))
    by_name = {os.path.basename(p): p for p in includes}
    graph = {p: {by_name[n] for n in ns if n in by_name} for p, ns in includes.items()}
    for loop in cycles(graph):
        print(f"FAIL: these files include each other in a loop: {', '.join(loop)}")
        fails += 1
    for lib, folder in OBJECTS.items():
        objs = {}
        for f in sorted(os.listdir(os.path.join(build, folder))):
            source = os.path.join(src, lib, f[:-len(".o")])
            if f.endswith(".c.o") and os.path.exists(source):  # not a removed file's object
                objs[f[:-len(".c.o")]] = symbols(os.path.join(build, folder, f))
        owner = {sym: name for name, (defined, _) in objs.items() for sym in defined}
        calls = {name: {owner[s] for s in used if s in owner and owner[s] != name}
                 for name, (_, used) in objs.items()}
        checked += len(objs)
        for loop in cycles(calls):
            print(f"FAIL: {lib}: these modules call each other in a loop: {', '.join(loop)}")
            fails += 1
    print(f"check_layers: {checked - fails} passed, {fails} failed")
    return 1 if fails or not checked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
