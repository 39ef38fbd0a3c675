"""The HTTP listening socket, bound before the server starts anything else.

Every server that launches processes (`tokenmill fleet`'s replicas, `tokenmill cluster`'s engines) or
opens side ports at start-up (KV connectors) gives them free ports chosen by the kernel. Bound only
when uvicorn starts, after all that, its own port could be handed out first: seen as "address already
in use" on a fleet whose --port was itself an ephemeral one. Bound first (as vLLM does before it
starts its engine), the port is held from the start, and a taken port fails in a second, not after
the models have loaded. uvicorn takes the socket through `Server.run(sockets=[...])`.
"""
from __future__ import annotations

import socket


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (SO_REUSEADDR, as uvicorn binds); OSError naming --port when
    the address is taken or cannot be bound. Not inheritable: child processes do not hold the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"--port {port}: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
