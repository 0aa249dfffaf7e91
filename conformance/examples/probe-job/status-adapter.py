#!/usr/bin/env python3
"""Status adapter for a runtime that has no status command at all: it runs one short probe
job over the DVM and reports which hosts answered, as the status JSON the conformance suite
reads (see conformance/README.md, "A runtime with no status command").

Usage: status-adapter.py [--timeout SECONDS] [--conf PATH] [--conf-env VAR]
                         [--self-name-env VAR] -- PROBE-JOB-COMMAND [ARGS...]

The DVM is formed when a job placed on every node DVMNodes names has run. The adapter
reads DVMNodes and DVMControllerHost from the DVM's prte.conf (--conf, default
/etc/prte.conf; or the file named by $VAR with --conf-env, when set), and fills {hosts}
(those nodes, comma separated, the controller's entry left out: it may run no job
processes) and {n} (how many) in the probe command. Each process of the probe prints the
name of the host it runs on. If the job ends with status 0 within the timeout, the DVM is
formed and its members are the hosts that answered, and the host the adapter runs on (the
controller's: it accepted the job), named by $VAR with --self-name-env when set, else by
the machine's host name. Otherwise the DVM is not formed and nothing is known of its
members: a runtime holds a job placed on a daemon that has not joined, or refuses it. Either way the adapter exits 0: "not formed" is an answer. It
exits 3, saying why, only when the probe cannot be run at all.

The suite lists no member for a DVM that is not formed, so it judges partial formation and
healing from the network (each daemon's established connection to DVMPort), not from here.
"""

import ipaddress
import json
import os
import socket
import subprocess
import sys


def fail(msg):
    print(f"status-adapter: {msg}", file=sys.stderr)
    sys.exit(3)


def split_top(text):
    """Splits a list at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand(entry):
    """The host names of one DVMNodes entry: a name, base[W:ranges]suffix, or pmix[...]."""
    if entry.startswith("pmix[") and entry.endswith("]"):
        return [h for e in split_top(entry[5:-1]) for h in expand(e)]
    if "[" not in entry:
        return [entry]
    base, rest = entry.split("[", 1)
    inner, suffix = rest.split("]", 1)
    width, ranges = inner.split(":", 1)
    hosts = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        for i in range(int(lo), int(hi or lo) + 1):
            hosts.append(f"{base}{i:0{int(width)}d}{suffix}")
    return hosts


def dvm_nodes(path):
    """DVMNodes (every syntax of the bootstrap spec) and DVMControllerHost of a prte.conf."""
    keys = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    keys[k.strip()] = v.strip()
    except OSError as e:
        fail(f"reading {path}: {e}")
    nodes = keys.get("DVMNodes")
    if not nodes:
        fail(f"{path}: no DVMNodes")
    if nodes.startswith("file:"):
        try:
            with open(nodes[5:]) as f:
                entries = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        except OSError as e:
            fail(f"{path}: DVMNodes {nodes}: {e}")
    else:
        entries = split_top(nodes)
    try:
        hosts = [h for e in entries for h in expand(e)]
    except ValueError:
        fail(f"{path}: cannot read DVMNodes {nodes!r}")
    controller = keys.get("DVMControllerHost", "")
    # Unless KeepFQDNHostnames is true, the spec compares names in their short form.
    if keys.get("KeepFQDNHostnames", "false").lower() != "true":
        hosts = [short(h) for h in hosts]
        controller = short(controller)
    return hosts, controller


def short(name):
    """A host name without its domain; an IP address as it is."""
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        return name.split(".")[0]


def main(argv):
    opts = {"--timeout": "5", "--conf": "/etc/prte.conf", "--conf-env": None,
            "--self-name-env": None}
    args = argv[1:]
    while args[:1] and args[0] in opts:
        if len(args) < 2:
            fail(f"{args[0]} needs a value")
        opts[args[0]] = args[1]
        args = args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        fail("usage: status-adapter.py [--timeout SECONDS] [--conf PATH] [--conf-env VAR] "
             "[--self-name-env VAR] -- PROBE-JOB-COMMAND [ARGS...]")
    try:
        timeout = float(opts["--timeout"])
    except ValueError:
        fail(f"--timeout: {opts['--timeout']!r} is not a number of seconds")
    conf = (opts["--conf-env"] and os.environ.get(opts["--conf-env"])) or opts["--conf"]
    self_env = opts["--self-name-env"]
    nodes, controller = dvm_nodes(conf)
    nodes = [h for h in nodes if h != controller]
    fill = {"{hosts}": ",".join(nodes), "{n}": str(len(nodes))}
    probe = []
    for w in args[1:]:
        for k, v in fill.items():
            w = w.replace(k, v)
        probe.append(w)
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
    hosts = {l.strip() for l in out.splitlines() if l.strip()} if formed else set()
    if hosts:
        hosts.add((self_env and os.environ.get(self_env)) or socket.gethostname())
    hosts = sorted(hosts)
    print(json.dumps({"formed": formed and bool(hosts),
                      "members": [{"host": h} for h in hosts]}))


if __name__ == "__main__":
    main(sys.argv)
