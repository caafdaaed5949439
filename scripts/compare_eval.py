#!/usr/bin/env python3
"""scripts/compare_eval.py A/eval.json B/eval.json [--scorer NAME ...]

Compares two `vgrpo eval` outputs (cli/cmd_eval.c: eval.json "stats" holds, per scorer and for "total", n, mean,
std, min, max and se = sample std / sqrt(n)). For each scorer present in both (default: every one; --scorer limits
it) it prints mean +- se for A and B, the difference B - A, its standard error se_diff = sqrt(se_A^2 + se_B^2) (the
two eval sets are treated as independent samples) and the difference in units of se_diff (z).
Python 3 standard library only. Exit status 0; 2 on a usage error or an unreadable file.
"""
import json
import math
import sys


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare_eval: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    stats = d.get("stats")
    if not isinstance(stats, dict) or not stats:
        print(f"compare_eval: {path}: no \"stats\" object (is it a vgrpo eval.json?)", file=sys.stderr)
        sys.exit(2)
    return d, stats


def label(path, d):
    ck = d.get("checkpoint")
    return f"{path} ({'checkpoint ' + ck if ck else 'initial weights: ' + str(d.get('model'))})"


def main(argv):
    args, scorers = [], []
    i = 0
    while i < len(argv):
        if argv[i] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if argv[i] == "--scorer" and i + 1 < len(argv):
            scorers.append(argv[i + 1])
            i += 2
            continue
        args.append(argv[i])
        i += 1
    if len(args) != 2:
        print("usage: compare_eval.py A/eval.json B/eval.json [--scorer NAME ...]", file=sys.stderr)
        return 2
    (da, sa), (db, sb) = load(args[0]), load(args[1])
    names = scorers or [k for k in sa if k in sb]
    missing = [k for k in names if k not in sa or k not in sb]
    if missing:
        print(f"compare_eval: scorer(s) {', '.join(missing)} not in both files", file=sys.stderr)
        return 2
    print(f"A: {label(args[0], da)}")
    print(f"B: {label(args[1], db)}")
    hdr = f"{'scorer':<14} {'n A':>5} {'mean A':>8} {'se A':>7} {'n B':>5} {'mean B':>8} {'se B':>7} " \
          f"{'B - A':>8} {'se_diff':>8} {'z':>7}"
    print(hdr)
    print("-" * len(hdr))
    for k in names:
        a, b = sa[k], sb[k]
        diff = b["mean"] - a["mean"]
        se = math.sqrt(a["se"] ** 2 + b["se"] ** 2)
        z = diff / se if se > 0 else float("inf") if diff > 0 else float("-inf") if diff < 0 else 0.0
        print(f"{k:<14} {a['n']:>5d} {a['mean']:>8.4f} {a['se']:>7.4f} {b['n']:>5d} {b['mean']:>8.4f} {b['se']:>7.4f} "
              f"{diff:>+8.4f} {se:>8.4f} {z:>+7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
