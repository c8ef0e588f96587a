#!/usr/bin/env python3
"""Code generator: turn a .csv or .json spec into a Python module on stdout.

    spec2py.py --var GREETINGS greetings.csv   # GREETINGS = {'de': 'Hallo', ...}
    spec2py.py --prefix APP_ app.json          # APP_NAME = 'greet' ...

The output is deterministic (sorted keys, repr() literals, no timestamps, no absolute
paths), so regenerating from an unchanged spec gives byte-identical output and the
targets that depend on it are not rebuilt (early cutoff).
"""

import argparse
import csv
import json
import os
import sys


def from_csv(path, var):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or len(rows[0]) != 2:
        sys.exit(f"{path}: expected a header row with exactly two columns")
    table = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2:
            sys.exit(f"{path}:{lineno}: expected 2 columns, got {len(row)}")
        key, value = (cell.strip() for cell in row)
        if key in table:
            sys.exit(f"{path}:{lineno}: duplicate key {key!r}")
        table[key] = value
    lines = [f"{var} = {{"]
    lines += [f"    {k!r}: {table[k]!r}," for k in sorted(table)]
    lines.append("}")
    return lines


def from_json(path, prefix):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        sys.exit(f"{path}: expected a JSON object at the top level")
    lines = []
    for key in sorted(data):
        if not key.isidentifier():
            sys.exit(f"{path}: key {key!r} is not a valid identifier")
        lines.append(f"{prefix}{key.upper()} = {data[key]!r}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="a .csv or .json file")
    p.add_argument("--var", default="TABLE", help="name of the dict built from a .csv")
    p.add_argument("--prefix", default="", help="prefix of the constants built from a .json")
    args = p.parse_args(argv)
    if args.spec.endswith(".csv"):
        body = from_csv(args.spec, args.var)
    elif args.spec.endswith(".json"):
        body = from_json(args.spec, args.prefix)
    else:
        sys.exit(f"{args.spec}: unsupported spec type (want .csv or .json)")
    name = os.path.basename(args.spec)
    # UTF-8 whatever the locale: actions run with a minimal environment (no LANG).
    sys.stdout.reconfigure(encoding="utf-8")
    print(f"# Generated from {name} by tools/spec2py.py - do not edit.")
    print("\n".join(body))


if __name__ == "__main__":
    main()
