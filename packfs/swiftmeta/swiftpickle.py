"""Swift's metadata pickles, read without running them.

The value of `user.swift.metadata` is whatever the application set. pickle's own
Unpickler, even with its globals restricted, lets a few bytes of it take the daemon:
a memo index of 2^28 made it fill a 4 GiB memo table (7 s of the event loop), and
`_codecs.encode` and `bytes` can be called with any arguments. So this reads only what
`pickle.dumps(metadata, protocol=2)` writes for a dict of bytes under Python 3, as a
stack machine that holds at most what the input spells out, and calls nothing.

Anything else, or anything malformed, is None: the value then stays as it was set. The
caller still pickles the dict again and compares, so the Swift form keeps only values
that give back their own bytes exactly. packfs/swiftmeta/_swiftform.c reads them the same way in
C; this stays for a build without it, and is what its tests compare it with.
"""
from __future__ import annotations

import struct

_U32 = struct.Struct("<I")
_ENCODE = object()  # the global `_codecs.encode`: bytes pickled as (str, "latin1")
_BYTES = object()  # the global `__builtin__.bytes`: b"" pickled as bytes()
_GLOBALS = {b"_codecs\nencode\n": _ENCODE, b"__builtin__\nbytes\n": _BYTES}

# The opcodes such a pickle holds, behind its PROTO 2 (pickletools names them).
(_EMPTY_DICT, _MARK_OP, _BINPUT, _LONG_BINPUT, _BINGET, _LONG_BINGET, _GLOBAL, _BINUNICODE,
 _TUPLE2, _EMPTY_TUPLE, _REDUCE, _SETITEM, _SETITEMS, _STOP) = b"}(qrhjcX\x86)Rsu."


class _Malformed(Exception):
    """Not what pickle.dumps writes for a dict of bytes (load_metadata answers None)."""


def load_metadata(data: bytes) -> dict[bytes, bytes] | None:
    """The dict of bytes a protocol-2 pickle of Swift's metadata holds, or None."""
    try:
        return _load(data)
    except (_Malformed, IndexError, KeyError, UnicodeError, struct.error, TypeError, ValueError):
        return None


def _load(data: bytes) -> dict[bytes, bytes] | None:
    if data[:2] != b"\x80\x02":
        return None
    stack: list = []
    push, pop = stack.append, stack.pop
    marks: list[int] = []  # where each MARK still open stands in the stack
    memo: dict[int, object] = {}
    u32 = _U32.unpack_from
    pos, end = 2, len(data)
    while pos < end:
        op = data[pos]
        pos += 1
        if op == _BINPUT:
            memo[data[pos]] = stack[-1]
            pos += 1
        elif op == _BINGET:
            push(memo[data[pos]])
            pos += 1
        elif op == _BINUNICODE:
            n = u32(data, pos)[0] + 4
            if pos + n > end:
                raise _Malformed
            push(data[pos + 4:pos + n].decode("utf-8"))
            pos += n
        elif op == _TUPLE2:
            second = pop()
            push((pop(), second))
        elif op == _REDUCE:
            args = pop()
            push(_reduce(pop(), args))
        elif op == _LONG_BINPUT:
            memo[u32(data, pos)[0]] = stack[-1]
            pos += 4
        elif op == _LONG_BINGET:
            push(memo[u32(data, pos)[0]])
            pos += 4
        elif op == _GLOBAL:
            module_end = data.find(b"\n", pos)
            stop = data.find(b"\n", module_end + 1) if module_end >= 0 else -1
            if stop < 0:
                raise _Malformed
            push(_GLOBALS[data[pos:stop + 1]])
            pos = stop + 1
        elif op == _EMPTY_TUPLE:
            push(())
        elif op == _EMPTY_DICT:
            push({})
        elif op == _MARK_OP:
            marks.append(len(stack))
        elif op == _SETITEMS:
            at = marks.pop()
            if at > len(stack):
                raise _Malformed
            items = stack[at:]
            del stack[at:]
            if len(items) % 2:
                raise _Malformed
            _set(stack[-1], items)
        elif op == _SETITEM:
            value = pop()
            key = pop()
            _set(stack[-1], [key, value])
        elif op == _STOP:
            if pos != end or marks or len(stack) != 1 or type(stack[0]) is not dict:
                return None
            return stack[0]
        else:
            return None
    return None


def _reduce(fn: object, args: object) -> bytes:
    """What the two globals Swift's pickles call return, for the arguments they pass."""
    if fn is _ENCODE and type(args) is tuple and len(args) == 2 and args[1] == "latin1" and type(args[0]) is str:
        return args[0].encode("latin1")
    if fn is _BYTES and args == ():
        return b""
    raise _Malformed


def _set(target: object, items: list) -> None:
    """SETITEM(S): keys and values, alternating, into the dict below them."""
    if type(target) is not dict:
        raise _Malformed
    for i in range(0, len(items), 2):
        key, value = items[i], items[i + 1]
        if type(key) is not bytes or type(value) is not bytes:
            raise _Malformed
        target[key] = value
