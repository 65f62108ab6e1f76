#!/usr/bin/env python3
"""CPU time per request of a payments service and of its PostgreSQL.

    cpu.py PORT new|replay N SERVICE_PID POSTMASTER_PID

Sends N sequential requests on one keep-alive connection (after 100 to warm
up; replay: 50 keys paid once, then cycled through) and prints the user and
system CPU time per request of the service's process and of the postmaster
and its children, from /proc: what the requests cost, rather than how fast
they go on a machine that other work shares.
"""

import http.client
import json
import os
import sys
import uuid


def cpu(pids):
    ticks = 0
    for pid in pids:
        try:
            fields = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def server_pids(postmaster):
    pids = [postmaster]
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[1] == postmaster:
                pids.append(pid)
        except OSError:
            pass
    return pids


def main():
    port, mode, n, service, postmaster = sys.argv[1:]
    port, n = int(port), int(n)
    body = json.dumps({"amount": 1250, "currency": "EUR"})
    conn = http.client.HTTPConnection("127.0.0.1", port)
    keys = [str(uuid.uuid4()) for _ in range(50)]

    def post(key):
        conn.request("POST", "/payments", body, {"Content-Type": "application/json", "Idempotency-Key": key})
        r = conn.getresponse()
        r.read()
        if r.status != 201:
            raise RuntimeError("answer %d" % r.status)

    def key(i):
        return keys[i % 50] if mode == "replay" else str(uuid.uuid4())

    for i in range(100 if mode == "new" else 50):
        post(keys[i] if mode == "replay" else key(i))
    for i in range(100):
        post(key(i))
    pids = server_pids(postmaster)
    s0, p0 = cpu([service]), cpu(pids)
    for i in range(n):
        post(key(i))
    s1, p1 = cpu([service]), cpu(pids)
    print("%s: service %.0f us/request, server %.0f us/request" % (mode, (s1 - s0) / n * 1e6, (p1 - p0) / n * 1e6))


if __name__ == "__main__":
    main()
