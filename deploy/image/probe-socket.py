#!/usr/bin/env python3
"""Liveness/readiness probe of the kubelet plugin: exit 0 when the unix socket accepts a connection.

A socket file alone proves nothing (a SIGKILLed plugin leaves it behind); a connection proves a
server is listening. Standard library only, so it runs in any image with python3.
"""

import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vgpu-dra-probe-socket SOCKET", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(3.0)
        try:
            sock.connect(argv[1])
        except OSError as exc:
            print(f"{argv[1]}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
