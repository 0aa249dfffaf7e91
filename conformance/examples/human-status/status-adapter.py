#!/usr/bin/env python3
"""Status adapter: runs a runtime's human-readable status command and prints the status JSON
the conformance suite reads (see conformance/README.md, "Status JSON").

Usage: status-adapter.py -- NATIVE-STATUS-COMMAND [ARGS...]

The native command here prints a table like

    DVM cluster-prte-dvm: NOT formed (2/3 daemons joined), radix 3
    controller ctl cluster-prte-dvm.0;tcp://10.200.0.2:7817:0
    links      authenticated and encrypted with the DVM key
      RANK  HOST  PARENT  TREE-PARENT  STATE
         0  ctl        -            -  joined
         1  n01        0            0  joined
         2  n02        -            0  waiting

Anything it cannot parse is an error (exit 3) naming the offending line, so a changed
format shows up as UNRESOLVED/FAIL rather than as a silently wrong status.
"""

import json
import re
import subprocess
import sys

HEADER = re.compile(r"^DVM (\S+): (formed|NOT formed) \((\d+)/(\d+) daemons joined\)")
CONTROLLER = re.compile(r"^controller (\S+) (\S+)\s*$")
# Whether the DVM's links are authenticated (dvmlab prints it since it has a DVM key).
LINKS = re.compile(r"^links\s+(authenticated and encrypted with the DVM key|UNAUTHENTICATED: .+)$")
STATES = {"joined", "waiting", "lost"}


def fail(msg):
    print(f"status-adapter: {msg}", file=sys.stderr)
    sys.exit(3)


def parse(text):
    lines = [l for l in text.splitlines() if l.strip()]
    if len(lines) < 3:
        fail(f"expected a header, a controller line and a table, got {text!r}")
    m = HEADER.match(lines[0])
    if not m:
        fail(f"line 1 is not a DVM header: {lines[0]!r}")
    status = {
        "namespace": m.group(1),
        "formed": m.group(2) == "formed",
        "expected": int(m.group(4)),
    }
    c = CONTROLLER.match(lines[1])
    if not c:
        fail(f"line 2 is not a controller line: {lines[1]!r}")
    status["controller_uri"] = c.group(2)
    first = 2
    if LINKS.match(lines[2]):
        first = 3
    if len(lines) <= first or lines[first].split()[:2] != ["RANK", "HOST"]:
        fail(f"line {first + 1} is not the table header: {lines[min(first, len(lines) - 1)]!r}")
    members = []
    for n, line in enumerate(lines[first + 1:], start=first + 2):
        f = line.split()
        if (len(f) != 5 or not f[0].isdigit() or f[4] not in STATES
                or not (f[2] == "-" or f[2].isdigit())):
            fail(f"line {n} is not a member row: {line!r}")
        members.append({
            "rank": int(f[0]),
            "host": f[1],
            "parent": None if f[2] == "-" else int(f[2]),
            "state": f[4],
        })
    status["members"] = members
    return status


def main(argv):
    if "--" not in argv:
        fail("usage: status-adapter.py -- NATIVE-STATUS-COMMAND [ARGS...]")
    native = argv[argv.index("--") + 1:]
    if not native:
        fail("no native status command given after --")
    try:
        r = subprocess.run(native, capture_output=True, text=True)
    except OSError as e:
        fail(f"running {native[0]}: {e}")
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        sys.exit(r.returncode)
    print(json.dumps(parse(r.stdout)))


if __name__ == "__main__":
    main(sys.argv)
