"""Requests sent at a fixed rate whatever the server does (an open loop), as seed 004's
"20 PUT/s for 10 minutes" was measured (with vegeta).

A closed loop (run_phase) sends the next request only when one returns, so a slow disk
lowers the offered load and hides its own latency. Here each request leaves at its
scheduled time on a thread of its own, and its latency counts from that time. A request
gets TIMEOUT seconds, vegeta's default, as the seed's did: the seed reports the share of
responses that came within it.
"""
from __future__ import annotations

import socket
import threading
import time

from . import swiftobj as so
from .util import latency_summary

TIMEOUT = 30.0


class Paced:
    """The outcome of one paced phase."""

    def __init__(self) -> None:
        self.lat: list[float] = []     # seconds, from each request's scheduled time; a timeout counts as TIMEOUT
        self.ok = 0
        self.timeouts = 0
        self.errors = 0
        self.first_error = ""
        self.lock = threading.Lock()

    def summary(self) -> dict:
        sent = len(self.lat)
        return {"sent": sent, "ok": self.ok, "timeouts": self.timeouts, "errors": self.errors,
                "first_error": self.first_error,
                "under_timeout_pct": 100.0 * sum(1 for x in self.lat if x < TIMEOUT) / sent if sent else None,
                **latency_summary(self.lat)}


def _one(port: int, name: str, size: int, due: float, out: Paced) -> None:
    err = ""
    try:
        c = so.Conn(port)
        try:
            c.sock.settimeout(max(0.1, due + TIMEOUT - time.monotonic()))
            st, _ = c.request("PUT", so.obj_path(name), {"X-Timestamp": so.next_ts(),
                                                          "Content-Type": "application/octet-stream"},
                              body=so.payload(), body_len=size)
        finally:
            c.close()
        if st != 201:
            err = f"PUT {name}: HTTP {st}"
    except socket.timeout:
        with out.lock:
            out.timeouts += 1
            out.lat.append(TIMEOUT)
        return
    except (OSError, so.HTTPError) as e:
        err = f"PUT {name}: {e}"
    dt = min(time.monotonic() - due, TIMEOUT)
    with out.lock:
        out.lat.append(dt)
        if err:
            out.errors += 1
            out.first_error = out.first_error or err
        else:
            out.ok += 1


def put_paced(port: int, prefix: str, size: int, rate: float, seconds: float) -> Paced:
    """PUT new objects `prefix-<i>` at `rate` a second for `seconds`; waits for the last answer."""
    out = Paced()
    threads = []
    start = time.monotonic()
    for i in range(int(rate * seconds)):
        due = start + i / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        th = threading.Thread(target=_one, args=(port, f"{prefix}-{i}", size, due, out), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(TIMEOUT + 5)
    return out
