"""The daemon's control socket: `packfs stats` and `packfs umount` talk to it.

An abstract Unix socket named after the pack id, so no path length limit applies and
nothing is left on disk. One JSON request per connection, one JSON reply.
"""
from __future__ import annotations

import json
import logging
import socket
from typing import Awaitable, Callable

import trio

log = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[dict]]


def address(pack_id: int) -> str:
    return f"\0packfs-{pack_id:08x}"


async def serve(pack_id: int, handler: Handler, task_status=trio.TASK_STATUS_IGNORED) -> None:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(address(pack_id))
    sock.listen(16)
    task_status.started()
    async with trio.open_nursery() as nursery:
        while True:
            conn, _ = await sock.accept()
            nursery.start_soon(_answer, conn, handler)


async def _answer(conn: trio.socket.SocketType, handler: Handler) -> None:
    with conn:
        try:
            request = json.loads((await conn.recv(4096)).decode())
            reply = await handler(request.get("command", ""))
        except Exception as e:  # a bad request must not take the daemon down
            log.exception("control request failed")
            reply = {"error": str(e)}
        view = memoryview(json.dumps(reply).encode())
        try:
            while view:
                view = view[await conn.send(view):]
        except OSError as e:
            log.warning("control client went away: %s", e)


def request(pack_id: int, command: str, timeout: float = 300.0) -> dict:
    """Client side, for the CLI (blocking)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(address(pack_id))
        s.sendall(json.dumps({"command": command}).encode())
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks).decode())
