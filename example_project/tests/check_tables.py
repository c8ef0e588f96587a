"""Check the generated modules against the specs they were generated from.

Usage: check_tables.py GREETINGS_TABLE_PY GREETINGS_CSV VERSION_PY APP_JSON
"""

import csv
import json
import runpy
import sys

table_py, table_csv, version_py, app_json = sys.argv[1:]

greetings = runpy.run_path(table_py)["GREETINGS"]
with open(table_csv, newline="", encoding="utf-8") as f:
    expected = {row["lang"]: row["greeting"] for row in csv.DictReader(f)}
assert greetings == expected, (greetings, expected)
assert list(greetings) == sorted(greetings), "keys are not sorted"

version = runpy.run_path(version_py)
with open(app_json, encoding="utf-8") as f:
    spec = json.load(f)
for key, value in spec.items():
    assert version["APP_" + key.upper()] == value, key

print(f"tables: {len(greetings)} greetings, version {version['APP_VERSION']}: ok")
