#!/usr/bin/env python3
"""Liveness/readiness probe of the kubelet plugin: exit 0 when the unix socket accepts a connection.

A socket file alone proves nothing (a SIGKILLed plugin leaves it behind); a connection proves a
server is listening. The path may name environment variables as `${NAME}` (the plugin's sockets
carry the pod UID, and Kubernetes does not expand variables in probe commands); an unset one is
an error, never an empty string. When the expanded path is too long for a unix socket, each
variable stands for the short form of its value instead, as the plugin names its sockets then
(`kubelet_plugin.server.short_instance`: base64url of the first 8 bytes of the SHA-256).
Standard library only, so it runs in any image with python3.
"""

import base64
import hashlib
import os
import re
import socket
import sys

MAX_SOCKET_PATH = 107
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def short(value: str) -> str:
    digest = hashlib.sha256(value.encode()).digest()[:8]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def expand(text: str, shorten: bool) -> str:
    def value(match: "re.Match[str]") -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if not found:
            raise KeyError(name)
        return short(found) if shorten else found

    return _VARIABLE.sub(value, text)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vgpu-dra-probe-socket SOCKET", file=sys.stderr)
        return 2
    try:
        path = expand(argv[1], shorten=False)
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            path = expand(argv[1], shorten=True)
    except KeyError as exc:
        print(f"{argv[1]}: environment variable {exc.args[0]} is not set", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(3.0)
        try:
            sock.connect(path)
        except OSError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
