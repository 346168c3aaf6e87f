#!/usr/bin/env python3
"""lint_floors.py - check the floors of runtime/src: each uses only itself and those below.

Floors, bottom first, are the Makefile's RT_FLOORS (base -> ref -> kernels -> vtpu).
Two checks:
  includes  every quoted #include in runtime/src/<floor>/ names a public header
            (tpu/...) or a header of its own floor or one below; every folder of
            runtime/src is a floor (a new folder must be placed in RT_FLOORS).
  symbols   (with --objects DIR) every undefined symbol of a floor's objects that
            the runtime itself defines is defined in that floor or one below: no
            call reaches up a floor, even through a prototype declared by hand.
Prints one line per floor and exits 1 on any violation."""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "runtime", "src")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def floors_from_makefile():
    text = open(os.path.join(ROOT, "Makefile")).read()
    m = re.search(r"^RT_FLOORS\s*:=\s*(.+)$", text, re.M)
    return [os.path.basename(p) for p in m.group(1).split()]


def floor_of_include(src_file, inc):
    """The floor a quoted include resolves to, 'public', or None if not found."""
    here = os.path.dirname(src_file)
    for base in (here, SRC, os.path.join(ROOT, "runtime", "include")):
        path = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(path):
            rel = os.path.relpath(path, ROOT).split(os.sep)
            if rel[:2] == ["runtime", "include"]:
                return "public"
            if rel[:2] == ["runtime", "src"] and len(rel) > 3:
                return rel[2]
            return "?" + "/".join(rel)
    return None


def check_includes(floors, errors):
    rank = {f: i for i, f in enumerate(floors)}
    counts = {}
    for entry in sorted(os.listdir(SRC)):
        full = os.path.join(SRC, entry)
        if os.path.isfile(full):
            errors.append(f"runtime/src/{entry}: a file outside every floor (put it in one of {floors})")
            continue
        if entry not in rank:
            errors.append(f"runtime/src/{entry}/: not a floor (add it to RT_FLOORS in the Makefile)")
    for floor in floors:
        d = os.path.join(SRC, floor)
        n = 0
        for name in sorted(os.listdir(d)):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(d, name)
            for inc in INCLUDE_RE.findall(open(path, errors="replace").read()):
                n += 1
                f = floor_of_include(path, inc)
                where = f"runtime/src/{floor}/{name}"
                if f is None:
                    errors.append(f'{where}: #include "{inc}" not found')
                elif f == "public":
                    continue
                elif f not in rank:
                    errors.append(f'{where}: #include "{inc}" is outside runtime/src floors ({f})')
                elif rank[f] > rank[floor]:
                    errors.append(f'{where}: #include "{inc}" reaches up from {floor} to {f}')
        counts[floor] = n
    return counts


def check_symbols(floors, objdir, errors):
    rank = {f: i for i, f in enumerate(floors)}
    objs = {}                                    # object path -> (floor, name)
    for floor in floors:
        d = os.path.join(objdir, floor)
        if not os.path.isdir(d):
            errors.append(f"{d}: no objects (build the runtime first)")
            continue
        srcs = {n[:-2] for n in os.listdir(os.path.join(SRC, floor)) if n.endswith(".c")}
        for name in sorted(os.listdir(d)):
            if name.endswith(".o") and name[:-2] in srcs:   # skips stale objects of moved files
                objs[os.path.join(d, name)] = (floor, name)
    if not objs:
        return 0
    # One nm for every object: "path:[address] type symbol" per line.
    out = subprocess.run(["nm", "-A", "-g"] + sorted(objs), capture_output=True, text=True, check=True).stdout
    defined, undefined = {}, {}
    for line in out.splitlines():
        path, _, rest = line.partition(":")
        parts = rest.split()
        floor, name = objs[path]
        if len(parts) == 2 and parts[0] == "U":
            undefined.setdefault(parts[1], []).append((floor, name))
        elif len(parts) == 3 and parts[1] in "TDBRWVi":
            defined[parts[2]] = floor
    n = 0
    for sym, users in sorted(undefined.items()):
        f = defined.get(sym)
        if f is None:
            continue                  # libc, libm, pthread, sanitizer runtime
        for floor, obj in users:
            n += 1
            if rank[f] > rank[floor]:
                errors.append(f"{floor}/{obj}: calls {sym} of the {f} floor (above {floor})")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", help="object directory mirroring runtime/src (e.g. build/rt)")
    args = ap.parse_args()
    floors = floors_from_makefile()
    errors = []
    counts = check_includes(floors, errors)
    print("floors (bottom first): " + " -> ".join(floors))
    for f in floors:
        print(f"  {f:8s} {counts.get(f, 0):3d} quoted includes checked")
    if args.objects:
        n = check_symbols(floors, os.path.join(ROOT, args.objects), errors)
        print(f"  symbols  {n} cross-file references checked in {args.objects}")
    for e in errors:
        print("FLOOR VIOLATION: " + e)
    print("floor check: " + ("OK" if not errors else f"{len(errors)} violation(s)"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
