#!/usr/bin/env python3
"""Checks the library dependency graph that `cmake --graphviz=FILE BUILD_DIR` writes: the
project's libraries (strata_*, libstrata) must form no cycle. Prints each library with what
it links, then either "no cycle" or the cycles found (exit status 1).

Usage: scripts/check_layering.py GRAPH.dot
"""
import re
import sys


def main():
    text = open(sys.argv[1]).read()
    names = {n: label.split("\\n")[0]
             for n, label in re.findall(r'"(node\d+)" \[ label = "([^"]+)"', text)}
    ours = {n for n, label in names.items() if label.startswith("strata_") or label == "libstrata"}
    deps = {n: set() for n in ours}
    for a, b in re.findall(r'"(node\d+)" -> "(node\d+)"', text):
        if a in ours and b in ours:
            deps[a].add(b)
    for n in sorted(ours, key=lambda n: names[n]):
        print(f"{names[n]} -> {', '.join(sorted(names[d] for d in deps[n])) or '(none)'}")
    # Depth-first search; a back edge closes a cycle.
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(deps[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(ours):
        if n not in state:
            visit(n)
    if cycles:
        for c in cycles:
            print("cycle: " + " -> ".join(names[n] for n in c))
        return 1
    print(f"no cycle among {len(ours)} libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
