#!/usr/bin/python3
"""The run-time library graph of dtrain's shared libraries has no cycle (issue 20; Note [GPU
plugins without a cycle] in core/gpu_backend.h).

Edges: every NEEDED entry of `readelf -d` of LIBDIR/libdtrain_*.so, plus the dlopen edges of the
plugin loader: comm/gpu_plugins.cpp opens libdtrain_cuda.so and libdtrain_nccl.so. So that list
cannot go stale, a dtrain library that imports dlopen and is not the loader fails the test (old
main's core did: core --dlopen--> cuda -> comm -> core). Prints the graph. Exit 77 (skipped)
in a build without the CUDA plugin. `--self-test` checks the cycle finder on old main's graph.
"""
import subprocess
import sys
from pathlib import Path

LOADERS = {"libdtrain_comm.so": ["libdtrain_cuda.so", "libdtrain_nccl.so"]}


def find_cycle(edges):
    """A cycle in {node: [node]} as a list of nodes (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def readelf(args, path):
    return subprocess.run(["readelf", *args, str(path)], check=True, capture_output=True, text=True).stdout


def needed(path):
    return [line.split("[", 1)[1].split("]", 1)[0] for line in readelf(["-d"], path).splitlines()
            if "(NEEDED)" in line]


def imports_dlopen(path):
    for line in readelf(["--dyn-syms", "-W"], path).splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[6] == "UND" and fields[7].split("@")[0] == "dlopen":
            return True
    return False


def self_test():
    old_main = {"libdtrain_core.so": ["libdtrain_cuda.so"], "libdtrain_cuda.so": ["libdtrain_core.so", "libdtrain_comm.so"],
                "libdtrain_comm.so": ["libdtrain_core.so"]}
    new = {"libdtrain_comm.so": ["libdtrain_core.so", "libdtrain_cuda.so", "libdtrain_nccl.so"],
           "libdtrain_cuda.so": ["libdtrain_core.so"], "libdtrain_nccl.so": ["libdtrain_cuda.so", "libdtrain_core.so"]}
    cycle = find_cycle(old_main)
    assert cycle and cycle[0] == cycle[-1] == "libdtrain_core.so", cycle
    assert find_cycle(new) is None, find_cycle(new)
    print("self-test: old main's graph has a cycle (" + " -> ".join(cycle) + "); the new one none")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    libdir = Path(sys.argv[1])
    if not (libdir / "libdtrain_cuda.so").exists():
        print(f"skipped: no {libdir}/libdtrain_cuda.so (a CPU-only build has no GPU plugins)")
        return 77
    libs = sorted(p for p in libdir.glob("libdtrain_*.so"))
    edges, problems = {}, []
    for lib in libs:
        edges[lib.name] = [(n, "NEEDED") for n in needed(lib)]
        if imports_dlopen(lib) and lib.name not in LOADERS:
            problems.append(f"{lib.name} imports dlopen but is not a known plugin loader ({', '.join(LOADERS)})")
        for target in LOADERS.get(lib.name, []):
            edges[lib.name].append((target, "dlopen"))
    for name, out in edges.items():
        print(name)
        for target, how in out:
            print(f"  -> {target}" + ("  (dlopen)" if how == "dlopen" else ""))
    cycle = find_cycle({name: [t for t, _ in out] for name, out in edges.items()})
    if cycle:
        problems.append("run-time cycle: " + " -> ".join(cycle))
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print("no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
