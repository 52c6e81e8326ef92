#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Counts test cases in meson test logs (testlog.json, one JSON per line).

TAP tests are counted per test case ("ok", "not ok", "# SKIP"); a test
executable that crashed or timed out before reporting counts as one failure.
Prints "N passed, N failed, N skipped" as its last line."""
import json
import re
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        print(f"count: {path}: missing (that run did not happen)", file=sys.stderr)
        failed += 1
        continue
    for line in lines:
        if not line.strip():
            continue
        t = json.loads(line)
        result = t.get("result", "")
        out = t.get("stdout") or ""
        p = f = s = 0
        for row in out.splitlines():
            if re.match(r"^ok \d+", row):
                if re.search(r"#\s*SKIP", row, re.I):
                    s += 1
                else:
                    p += 1
            elif re.match(r"^not ok \d+", row):
                if re.search(r"#\s*TODO", row, re.I):
                    s += 1
                else:
                    f += 1
        if p + f + s == 0:
            if result == "OK":
                p = 1
            elif result == "SKIP":
                s = 1
            else:
                f = 1
        elif result not in ("OK", "SKIP", "EXPECTEDFAIL") and f == 0:
            f = 1  # crashed after its last report
        passed, failed, skipped = passed + p, failed + f, skipped + s
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
