"""The wire between the judged program and its judge (`sarl.checking.code.sandbox`): framed messages of plain data.

Standard library only: its text is put at the top of both `runner.py` (the untrusted side, inside the
sandbox) and `judge.py` (the trusted side), which run as `python -I -S -c <text>`; the project imports it
only to test it.

A frame is a 4-byte big-endian length and that many bytes of ASCII JSON, written and read with the C accelerator
`_json` directly (`json` itself would import `re` and `enum`: 11 ms of start-up on each side of every program).

Values are plain data only: None, bool, int, float, str as themselves (an int beyond 2**53 as `{"int": hex}`, so
no decimal digit limit applies), and `{"list": [...]}`, `{"tuple": [...]}`, `{"set": [...]}`, `{"frozenset": [...]}`,
`{"dict": [[k, v], ...]}`, `{"bytes": hex}`, `{"complex": [re, im]}`,
`{"range": [start, stop, step]}`. Each type is checked exactly (`type(x) is int`), so a subclass of a builtin is
not plain data. A value the sender cannot encode as plain data goes as
`{"ref": id}` when the sender allows it (a handle: `other(value)` returns the id) and raises `WireError` otherwise.
`decode` builds fresh builtin objects only: whatever the other side sent, the receiver holds ints, strings, lists
... and handles it made itself (`ref(id)`).
"""

import _json as _wire_c
import os as _wire_os

WIRE_MAX_DEPTH = 100
_WIRE_TAGS = frozenset(("int", "list", "tuple", "set", "frozenset", "dict", "bytes", "complex", "range", "ref"))
_WIRE_SAFE_INT = 1 << 53


class _WireScanContext:
    """What `_json.make_scanner` reads: strict JSON, plain dicts and lists, NaN and the infinities allowed."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__
    memo = {}


_wire_scan = _wire_c.make_scanner(_WireScanContext())
_wire_dump = _wire_c.make_encoder(None, None, _wire_c.encode_basestring_ascii, None, ":", ",", False, False, True)


def wire_dumps(data):
    """JSON text of JSON-ready `data` (dicts with str keys, lists, str, int, float, bool, None)."""
    return "".join(_wire_dump(data, 0))


def wire_loads(text):
    """The JSON value of `text`, which must hold exactly one; WireError otherwise."""
    try:
        value, end = _wire_scan(text, 0)
    except (ValueError, StopIteration, RecursionError, KeyError) as err:
        raise WireError("not a JSON message: %s" % (str(err)[:200],)) from None
    if text[end:].strip():
        raise WireError("text after the JSON message")
    return value


class WireError(Exception):
    """A value that is not plain data (and may not be a handle), or a frame that is not a valid message."""


def wire_encode(value, other=None, depth=0):
    """`value` as JSON-ready data (see the module docstring); `other(value) -> id` for what is not plain data."""
    if depth > WIRE_MAX_DEPTH:
        raise WireError("nested deeper than %d" % WIRE_MAX_DEPTH)
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -_WIRE_SAFE_INT < value < _WIRE_SAFE_INT else {"int": hex(value)}
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [wire_encode(v, other, depth + 1) for v in value]}
    if kind is dict:
        return {
            "dict": [[wire_encode(k, other, depth + 1), wire_encode(v, other, depth + 1)] for k, v in value.items()]
        }
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is range:
        return {"range": [wire_encode(value.start), wire_encode(value.stop), wire_encode(value.step)]}
    if other is None:
        raise WireError("a %s is not plain data" % kind.__name__)
    return {"ref": other(value)}


def _wire_items(payload):
    if type(payload) is not list:
        raise WireError("a container's items must be a list")
    return payload


def wire_decode(data, ref=None, depth=0):
    """Fresh builtin objects from `wire_encode`'s output; `ref(id)` makes the receiver's handle for `{"ref": id}`
    (refused without it). Raises WireError on anything else."""
    if depth > WIRE_MAX_DEPTH:
        raise WireError("nested deeper than %d" % WIRE_MAX_DEPTH)
    kind = type(data)
    if data is None or kind is bool or kind is str or kind is float or kind is int:
        return data
    if kind is not dict or len(data) != 1:
        raise WireError("not a value: %s" % kind.__name__)
    ((tag, payload),) = data.items()
    if tag not in _WIRE_TAGS:
        raise WireError("unknown tag %r" % (tag[:40],))
    try:
        if tag == "int":
            if type(payload) is not str:
                raise WireError("an int must be hex text")
            return int(payload, 16)
        if tag == "bytes":
            if type(payload) is not str:
                raise WireError("bytes must be hex text")
            return bytes.fromhex(payload)
        if tag == "complex":
            if type(payload) is not list or len(payload) != 2 or any(type(p) not in (int, float) for p in payload):
                raise WireError("a complex must be two numbers")
            return complex(payload[0], payload[1])
        if tag == "range":
            if type(payload) is not list or len(payload) != 3:
                raise WireError("a range must be [start, stop, step]")
            bounds = [wire_decode(p, None, depth + 1) for p in payload]
            if any(type(b) is not int for b in bounds):
                raise WireError("a range's bounds must be ints")
            return range(*bounds)
        if tag == "ref":
            if ref is None or type(payload) is not int:
                raise WireError("a handle is not allowed here")
            return ref(payload)
        items = _wire_items(payload)
        if tag == "dict":
            out = {}
            for pair in items:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("a dict item must be a [key, value] pair")
                out[wire_decode(pair[0], ref, depth + 1)] = wire_decode(pair[1], ref, depth + 1)
            return out
        values = [wire_decode(v, ref, depth + 1) for v in items]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](values)
    except (TypeError, ValueError, RecursionError) as err:  # unhashable set item or key, bad hex, too deep
        raise WireError("%s: %s" % (tag, err)) from None


def wire_frame(message):
    """One frame of `message` (JSON-ready data): its length in 4 bytes, big-endian, then its ASCII JSON."""
    body = wire_dumps(message).encode("ascii")
    return len(body).to_bytes(4, "big") + body


def wire_send(fd, message):
    """Write one frame (`message`: JSON-ready data) to descriptor `fd`."""
    view = memoryview(wire_frame(message))
    while view:
        written = _wire_os.write(fd, view)
        view = view[written:]


def _wire_read_exact(fd, size):
    chunks, left = [], size
    while left:
        chunk = _wire_os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the wire")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def wire_receive(fd, max_bytes):
    """Read one frame from `fd`: the parsed JSON. EOFError when the other side is gone; WireError for a frame
    over `max_bytes` or one that is not JSON."""
    size = int.from_bytes(_wire_read_exact(fd, 4), "big")
    if size > max_bytes:
        raise WireError("a message of %d bytes is over the limit of %d" % (size, max_bytes))
    body = _wire_read_exact(fd, size)
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise WireError("not an ASCII message") from None
    return wire_loads(text)
