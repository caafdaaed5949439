#!/usr/bin/env python3
"""scripts/check_layout.py — the layering check (`make check-layout`; tests/test_layout.c runs it in the suite).

The source folders stand in one order, top to bottom:

    cli > bench > trainer, rollout (peers) > reward > media > model > sp > kernels > core

A file (*.c, *.h) may `#include "X/..."` only its own folder or a folder strictly below it: trainer/ and rollout/
never include each other, and nothing includes cli/. model/'s subfolders dit, vae, text and clip are peers that
never include each other; flow stands above dit and vae (its denoising step builds the DiT's input and calls it) and
they never include flow (a file directly in model/, if any, may include them all). trainer/'s subfolders stand in
their own order, top to bottom (peers never include each other; a subfolder not in it is an error):

    run > net, checkpoint, budget (peers) > dp > step > optim

tests/ may include anything. A folder that does not exist (bench/, while it is being created) is fine.

Second part, from the object files' symbols (`nm` on DIR/<folder>/*.o, DIR from --build, default ROOT/build):
- a graph "a.c uses a function or variable defined in b.c" among the .c files of one folder (one model/ or trainer/
  subfolder), and any cycle in it. A cycle inside a model/ subfolder, or in a folder not in KNOWN_CYCLES, is an
  error; one in a KNOWN_CYCLES folder is printed as a warning.
- a file that uses a symbol defined in a folder it may not include (declared by hand, so the include rule missed it).
Without object files this part is skipped, with a note; a .c file without an object is left out. The objects are
what the last build made: build first, or the graph may be stale.

Third part, from the file names: a model file written twice, once per backend. A file model/<sub>/<p>_dev_<rest>.c
beside model/<sub>/<p>_<rest>.c is a device twin of it (the same layer or model again on the device table): an error,
since the model is written once over the backend interface and the executor picks where it runs. KNOWN_TWINS lists
twins not folded in yet, printed as warnings; it is empty, and stays so.

Also printed, as a warning only: cli/ files over 300 lines.

Exit 0 when there is no error, 1 when there is one (each printed as `file:line: ...`), 2 on bad usage.
Python 3 standard library only.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ORDER = [["cli"], ["bench"], ["trainer", "rollout"], ["reward"], ["media"], ["model"], ["sp"], ["kernels"], ["core"]]
RANK = {f: i for i, group in enumerate(ORDER) for f in group}
MODEL_SUBS = ["dit", "vae", "text", "flow", "clip"]
# The sub-order inside model/: a subfolder may include the ones listed for it (and those never include it).
MODEL_ABOVE = {"flow": {"dit", "vae"}}
TRAINER_ORDER = [["run"], ["net", "checkpoint", "budget"], ["dp"], ["step"], ["optim"]]
TRAINER_RANK = {f: i for i, group in enumerate(TRAINER_ORDER) for f in group}
# Top folders whose .c files may keep file-level cycles for now: reported as warnings, not errors (never for
# model/). Empty: no folder had one when this check was written, so any new cycle is an error.
KNOWN_CYCLES = set()
CLI_LINES_WARN = 300
# Device twins of model files that still exist (the DiT's forward, backward, activations and layers on k_dev_ops):
# warnings until they are folded into their CPU files; any other twin, or one of these added back, is an error.
KNOWN_TWINS = set()  # every twin folded in (the DiT's: one forward and backward over the op table)
TWIN_RE = re.compile(r"^(model/[^/]+/[A-Za-z0-9]+)_dev_([A-Za-z0-9_]+\.c)$")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def unit_of(rel):
    """The layering unit of a repo-relative path: 'model/dit' or 'trainer/step' for a subfolder of those two, else
    the top folder."""
    parts = rel.split("/")
    if parts[0] in ("model", "trainer") and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]


def below_text(folder):
    r = RANK[folder]
    names = [f for group in ORDER[r + 1:] for f in group]
    return ", ".join(names) if names else "nothing"


def include_violation(src_unit, inc_path):
    """None if src_unit may include inc_path, else the message."""
    inc_parts = inc_path.split("/")
    if len(inc_parts) < 2:
        return None  # "x.h": the file's own folder
    if inc_parts[0] == "..":
        return "includes %s by a relative path (write it from the repo root: \"folder/file.h\")" % inc_path
    dst_top = inc_parts[0]
    if dst_top not in RANK:
        return None  # not a source folder (a generated or third-party header)
    src_top = src_unit.split("/")[0]
    if src_top not in RANK:
        return None  # tests/ and other folders: anything goes
    if src_top == dst_top:
        if src_top == "model" and len(inc_parts) > 2:
            dst_unit = "model/" + inc_parts[1]
            if (src_unit != "model" and dst_unit != src_unit and inc_parts[1] in MODEL_SUBS
                    and inc_parts[1] not in MODEL_ABOVE.get(src_unit.split("/")[1], ())):
                return ("folder %s includes folder %s (model's subfolders %s are peers that never include each other, "
                        "except that flow stands above dit and vae)" % (src_unit, dst_unit, ", ".join(MODEL_SUBS)))
        if src_top == "trainer" and len(inc_parts) > 2:
            return trainer_violation(src_unit, inc_parts[1])
        return None
    if RANK[dst_top] > RANK[src_top]:
        return None
    return ("folder %s includes folder %s (%s must only include folders below it: %s)"
            % (src_unit, dst_top, src_top, below_text(src_top)))


def trainer_violation(src_unit, dst_sub):
    """None if a file of src_unit ('trainer' or 'trainer/<sub>') may include trainer/<dst_sub>/, else the message."""
    order = " > ".join(", ".join(group) for group in TRAINER_ORDER)
    src_sub = src_unit.split("/")[1] if "/" in src_unit else None
    for sub in (src_sub, dst_sub):
        if sub is not None and sub not in TRAINER_RANK:
            return "folder trainer/%s is not in trainer's order (%s): add it to TRAINER_ORDER" % (sub, order)
    if src_sub is None or src_sub == dst_sub or TRAINER_RANK[dst_sub] > TRAINER_RANK[src_sub]:
        return None
    return ("folder %s includes folder trainer/%s (trainer's subfolders include only those below them: %s)"
            % (src_unit, dst_sub, order))


def source_files(root):
    out = []
    for top in sorted(RANK):
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith((".c", ".h")):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return out


def check_includes(root, files):
    errors = []
    for rel in files:
        unit = unit_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                msg = include_violation(unit, m.group(1))
                if msg:
                    errors.append("%s:%d: %s" % (rel, lineno, msg))
    return errors


def nm_symbols(obj):
    """(defined, undefined) external symbol names of one object file."""
    res = subprocess.run(["nm", "-P", obj], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        raise RuntimeError("nm %s: %s" % (obj, res.stderr.strip()))
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCGSVW" and kind.isupper():  # global definitions (lowercase kinds are file-local)
            defined.add(name)
    return defined, undefined


def find_cycles(nodes, edges):
    """Strongly connected components with more than one node (Tarjan), each sorted; edges: node -> set(node)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        # Iterative Tarjan, so a long chain cannot hit Python's recursion limit.
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(sccs)


def cycle_path(comp, edges):
    """One concrete cycle through the component, as 'a.c -> b.c -> a.c' (a shortest one back to its first file)."""
    start, members = comp[0], set(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    path.reverse()
                    return " -> ".join(path + [start])
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return " <-> ".join(comp)


def first_line_naming(path, name):
    """The first line of path that names the symbol (for file:line), or 1."""
    word = re.compile(r"\b%s\b" % re.escape(name))
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if word.search(line):
                    return lineno
    except OSError:
        pass
    return 1


def check_objects(root, files, build):
    """(errors, warnings, notes) from the object files' symbols: file-level cycles inside each folder, and a
    folder that calls into a folder it may not include (a local extern declaration slips past the include rule)."""
    errors, warnings, notes = [], [], []
    if not shutil.which("nm"):
        return errors, warnings, ["note: nm not found; the object-file checks are skipped"]
    defs, uses, missing = {}, {}, []
    for rel in files:
        if not rel.endswith(".c"):
            continue
        obj = os.path.join(build, rel[:-2] + ".o")
        if not os.path.isfile(obj):
            missing.append(rel)
            continue
        defs[rel], uses[rel] = nm_symbols(obj)
    if not defs:
        return errors, warnings, ["note: no object files under %s/; the object-file checks (cycles, calls across "
                                  "folders) are skipped (build first, or pass --build DIR)" % build]
    if missing:
        notes.append("note: %d .c file(s) have no object under %s/ (e.g. %s); left out of the object-file checks"
                     % (len(missing), build, missing[0]))
    owner = {}
    for rel in sorted(defs):
        for name in defs[rel]:
            owner.setdefault(name, rel)
    by_unit = {}
    for rel in sorted(defs):
        by_unit.setdefault(unit_of(rel), []).append(rel)
        for name in sorted(uses[rel]):
            dst = owner.get(name)
            if not dst:
                continue
            msg = include_violation(unit_of(rel), dst)
            if msg:
                line = first_line_naming(os.path.join(root, rel), name)
                msg = msg.replace(" includes folder ", " calls into folder ", 1)
                errors.append("%s:%d: uses %s, defined in %s: %s" % (rel, line, name, dst, msg))
    for unit in sorted(by_unit):
        members = set(by_unit[unit])
        edges = {rel: {owner[s] for s in uses[rel] if owner.get(s) in members and owner[s] != rel}
                 for rel in by_unit[unit]}
        top = unit.split("/")[0]
        for comp in find_cycles(members, edges):
            msg = "file-level cycle in %s/: %s" % (unit, cycle_path(comp, edges))
            if top == "model" or top not in KNOWN_CYCLES:
                errors.append("%s:1: %s (the files of a folder must not call each other in a circle)" % (comp[0], msg))
            else:
                warnings.append("warning: %s (known; %s is in KNOWN_CYCLES)" % (msg, top))
    return errors, warnings, notes


def cli_long_files(root, files):
    out = []
    for rel in files:
        if rel.startswith("cli/"):
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                n = sum(1 for _ in f)
            if n > CLI_LINES_WARN:
                out.append("warning: %s has %d lines (over %d)" % (rel, n, CLI_LINES_WARN))
    return out


def model_twins(files):
    """Errors and warnings for the device twins of model files among files (see the top)."""
    errors, warnings = [], []
    present = set(files)
    for rel in files:
        m = TWIN_RE.match(rel)
        if not m:
            continue
        twin_of = "%s_%s" % (m.group(1), m.group(2))
        if twin_of not in present:
            continue
        msg = "%s:1: a device twin of %s (the same model code again for another backend: write it once over the " \
              "backend interface, and let the executor choose where it runs)" % (rel, twin_of)
        if rel in KNOWN_TWINS:
            warnings.append("warning: %s (known; in KNOWN_TWINS)" % msg)
        else:
            errors.append(msg)
    return errors, warnings


def main(argv):
    ap = argparse.ArgumentParser(description="vgrpo layering check: include order between folders, file-level "
                                 "cycles inside a folder.")
    ap.add_argument("--root", default=None, help="repository root (default: this script's parent folder)")
    ap.add_argument("--build", default=None, help="build folder with the object files (default: ROOT/build)")
    ap.add_argument("--no-objects", action="store_true", help="skip the object-file checks (cycles, calls across "
                    "folders)")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not os.path.isdir(root):
        print("check_layout: --root %s is not a folder" % root, file=sys.stderr)
        return 2
    build = (args.build or os.path.join(root, "build")).rstrip("/") or "/"
    files = source_files(root)
    errors = check_includes(root, files)
    warnings, notes = [], []
    if not args.no_objects:
        cerr, warnings, notes = check_objects(root, files, build)
        errors += cerr
    terr, twarn = model_twins(files)
    errors += terr
    warnings += twarn + cli_long_files(root, files)
    for line in notes + warnings:
        print(line)
    for line in errors:
        print(line)
    print("check_layout: %d file(s), %d error(s), %d warning(s)" % (len(files), len(errors), len(warnings)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
