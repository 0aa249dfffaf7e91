#!/usr/bin/env python3
"""Status adapter for a runtime that has no status command at all: it runs one short probe
job over the DVM and reports which hosts answered, as the status JSON the conformance suite
reads (see conformance/README.md, "A runtime with no status command").

Usage: status-adapter.py [--timeout SECONDS] -- PROBE-JOB-COMMAND [ARGS...]

The probe job must start only on a formed DVM, one process per node, each printing the name
of the host it runs on (one line). If it ends with status 0 within the timeout, the DVM is
formed and its members are the hosts that answered; otherwise it is not formed and nothing
is known of its members. Either way the adapter exits 0: "not formed" is an answer. It
exits 3, saying why, only when the probe cannot be run at all.

The suite lists no member for a DVM that is not formed, so it judges partial formation and
healing from the network (each daemon's established connection to DVMPort), not from here.
"""

import json
import subprocess
import sys


def fail(msg):
    print(f"status-adapter: {msg}", file=sys.stderr)
    sys.exit(3)


def main(argv):
    timeout = 5.0
    args = argv[1:]
    if args[:1] == ["--timeout"]:
        try:
            timeout = float(args[1])
        except (IndexError, ValueError):
            fail("--timeout needs a number of seconds")
        args = args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        fail("usage: status-adapter.py [--timeout SECONDS] -- PROBE-JOB-COMMAND [ARGS...]")
    probe = args[1:]
    try:
        p = subprocess.Popen(probe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        fail(f"running {probe[0]}: {e}")
    try:
        out, _ = p.communicate(timeout=timeout)
        formed = p.returncode == 0
    except subprocess.TimeoutExpired:
        # The runtime holds the job until every daemon is there: not formed (yet). Asked
        # to stop, the tool cancels the job it submitted.
        p.terminate()
        try:
            p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        out, formed = "", False
    hosts = sorted({l.strip() for l in out.splitlines() if l.strip()}) if formed else []
    print(json.dumps({"formed": formed and bool(hosts),
                      "members": [{"host": h} for h in hosts]}))


if __name__ == "__main__":
    main(sys.argv)
