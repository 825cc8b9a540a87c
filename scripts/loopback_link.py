#!/usr/bin/env python3
"""Measures this host's loopback TCP link, the link the CPU workers' Gloo uses.

Prints one line: `BANDWIDTH_GBPS=<10^9 bytes/s> LATENCY_US=<one-way, microseconds>`, the
constants the step-time model takes for the CPU run (scripts/run-cluster.sh: the measured
against predicted table). Bandwidth: one stream of TOTAL_MIB through a socket pair on
127.0.0.1 (port 0); latency: half the mean round trip of ROUND_TRIPS one-byte messages.

  scripts/loopback_link.py [TOTAL_MIB (256)] [ROUND_TRIPS (2000)]
"""
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def _pair():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server


def bandwidth(total_mib):
    client, server = _pair()
    total = total_mib * CHUNK
    payload = b"\0" * CHUNK

    def send():
        for _ in range(total_mib):
            client.sendall(payload)

    sender = threading.Thread(target=send)
    buf = bytearray(CHUNK)
    got = 0
    start = time.perf_counter()
    sender.start()
    while got < total:
        n = server.recv_into(buf)
        if n == 0:
            raise RuntimeError("loopback stream closed early")
        got += n
    seconds = time.perf_counter() - start
    sender.join()
    client.close()
    server.close()
    return total / seconds


def latency(round_trips):
    client, server = _pair()

    def echo():
        for _ in range(round_trips):
            server.sendall(server.recv(1))

    t = threading.Thread(target=echo)
    t.start()
    start = time.perf_counter()
    for _ in range(round_trips):
        client.sendall(b"x")
        client.recv(1)
    seconds = time.perf_counter() - start
    t.join()
    client.close()
    server.close()
    return seconds / round_trips / 2


def main(argv):
    total_mib = int(argv[1]) if len(argv) > 1 else 256
    round_trips = int(argv[2]) if len(argv) > 2 else 2000
    if total_mib < 1 or round_trips < 1:
        print("usage: loopback_link.py [TOTAL_MIB >= 1] [ROUND_TRIPS >= 1]", file=sys.stderr)
        return 2
    print("BANDWIDTH_GBPS=%.4f LATENCY_US=%.2f" % (bandwidth(total_mib) / 1e9,
                                                  latency(round_trips) * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
