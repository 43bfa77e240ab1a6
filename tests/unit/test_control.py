"""The control socket: one JSON request, one reply; a silent client is let go."""
from __future__ import annotations

import json
import os
import socket

import trio

from packfs.fuse import control


def _serve_and_ask(monkeypatch, send: bytes | None) -> dict:
    monkeypatch.setattr(control, "REQUEST_SECONDS", 0.2)
    pack_id = int.from_bytes(os.urandom(4), "little")
    asked: list[str] = []

    async def handler(command: str) -> dict:
        asked.append(command)
        return {"ok": True, "command": command}

    def client() -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(control.address(pack_id))
            if send is not None:
                s.sendall(send)
                s.shutdown(socket.SHUT_WR)
            return json.loads(s.recv(65536).decode())

    async def main() -> dict:
        async with trio.open_nursery() as nursery:
            await nursery.start(control.serve, pack_id, handler)
            reply = await trio.to_thread.run_sync(client)
            nursery.cancel_scope.cancel()
        return reply

    reply = trio.run(main)
    assert asked == ([] if "error" in reply else [reply["command"]])
    return reply


def test_a_request_gets_its_reply(monkeypatch):
    assert _serve_and_ask(monkeypatch, b'{"command": "stats"}') == {"ok": True, "command": "stats"}


def test_a_client_that_sends_nothing_is_let_go(monkeypatch):
    assert _serve_and_ask(monkeypatch, None) == {"error": "no request within 0.2 s"}


def test_a_malformed_request_is_an_error_reply(monkeypatch):
    assert "error" in _serve_and_ask(monkeypatch, b"{not json")
