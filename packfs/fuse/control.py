"""The daemon's control socket: `packfs stats`, `packfs sync` and `packfs umount` talk to it.

Commands: "stats"; "commit" (`packfs sync`: every change so far committed, the reply
once the device has flushed it); "sync" (`packfs umount`, before it unmounts: a commit,
then a checkpoint of the catalog, so the next mount replays nothing).

An abstract Unix socket named after the pack id, so no path length limit applies and
nothing is left on disk. One JSON request per connection, one JSON reply.

Any local user can connect to an abstract socket (/proc/net/unix lists their names),
and the commands hold the event loop (a commit or a checkpoint; a count over every inode). So the
daemon answers only root and its own user (the peer's credentials, SO_PEERCRED), and a
connection that sends no request within REQUEST_SECONDS is closed.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import struct
from typing import Awaitable, Callable

import trio

log = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[dict]]
REQUEST_SECONDS = 10.0
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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
        _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid not in (0, os.getuid()):
            log.warning("control request from uid %d refused", uid)
            handler = _refuse  # its request is still read: closing first broke the client's send
        reply = await _reply(conn, handler)
        view = memoryview(json.dumps(reply).encode())
        try:
            while view:
                view = view[await conn.send(view):]
        except OSError as e:
            log.warning("control client went away: %s", e)


async def _refuse(command: str) -> dict:
    return {"error": f"permission denied: only root or uid {os.getuid()} may ask the daemon"}


async def _reply(conn: trio.socket.SocketType, handler: Handler) -> dict:
    """The handler's answer to the connection's one request (at most 4 KiB of JSON, ended
    by the client's shutdown), or why there is none."""
    data = b""
    with trio.move_on_after(REQUEST_SECONDS) as waiting:
        while len(data) <= 4096 and (chunk := await conn.recv(4096)):
            data += chunk
    if waiting.cancelled_caught:
        return {"error": f"no request within {REQUEST_SECONDS:g} s"}
    try:
        request = json.loads(data.decode())
        return await handler(request.get("command", ""))
    except Exception as e:  # a bad request must not take the daemon down
        log.exception("control request failed")
        return {"error": str(e)}


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
