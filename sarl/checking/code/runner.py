"""The untrusted side of a code run (`sarl.checking.code.sandbox`): runs the program in the sandbox, only computes.

Run as `python -I -S -c <wire.py + this file>` inside bubblewrap; never imported by the project. It
never sees the tests: it reads the program (and the problem's prelude) as one frame on descriptor 0, sets its
resource limits, runs the prelude and the program, and reports on the reply pipe the program's top-level names
(plain values as values; functions, classes and other objects as handles; imported modules by name). Then it
answers the judge's requests on the request pipe until the judge closes it: call a handle, read or set an
attribute, iterate, or (stdin problems) run the program as a script on a given standard input. Each reply is
the result as plain data (what is not plain data becomes a handle), or the exception raised (its builtin class
by name, or the program's own class as a handle), with what the program printed during the request.

Nothing here is trusted: the program can replace any of it, write any frame and read the requests. That gains
it nothing: the judge decodes frames into plain data only and evaluates every comparison itself.
"""

import builtins as _builtins
import io as _io
import resource as _resource
import sys as _sys

_REQUESTS, _REPLIES = _SANDBOX_FDS
_MAX_TEXT = 1 << 16  # an exception message, kept whole up to this many characters


def _limits(limits):
    for name, value in limits["rlimits"].items():
        soft = hard = value
        if name == "RLIMIT_CPU":
            hard = value + 1  # SIGXCPU at the soft limit, SIGKILL a second later
        _resource.setrlimit(getattr(_resource, name), (soft, hard))


class _Handles:
    def __init__(self):
        self.objects, self.ids = [], {}

    def add(self, value):
        key = id(value)
        if key in self.ids and self.objects[self.ids[key]] is value:
            return self.ids[key]
        self.objects.append(value)
        self.ids[key] = len(self.objects) - 1
        return self.ids[key]

    def get(self, index):
        if type(index) is not int or not 0 <= index < len(self.objects):
            raise WireError("no handle %r" % (index,))
        return self.objects[index]


_handles = _Handles()


def _encode(value):
    return wire_encode(value, _handles.add)


def _decode(data):
    return wire_decode(data, _handles.get)


def _builtin_base(cls):
    """The nearest class of `cls`'s method resolution order that is a builtin exception (by its name)."""
    for base in cls.__mro__:
        if base.__module__ == "builtins" and getattr(_builtins, base.__name__, None) is base:
            return base.__name__
    return "Exception"


def _exception(err):
    cls = type(err)
    builtin = cls.__module__ == "builtins" and getattr(_builtins, cls.__name__, None) is cls
    try:
        args = wire_encode(list(err.args))  # plain args only; else the message
    except Exception:
        args = None
    try:
        text = str(err)[:_MAX_TEXT]
    except Exception:
        text = "<unprintable %s>" % cls.__name__
    return {
        "cls": cls.__name__ if builtin else None,
        "ref": None if builtin else _handles.add(cls),
        "base": cls.__name__ if builtin else _builtin_base(cls),
        "name": str(cls.__name__)[:200],
        "args": args,
        "text": text,
    }


def _describe(value):
    if isinstance(value, type(_sys)):
        return {"module": value.__name__}
    try:
        return {"value": wire_encode(value)}
    except (WireError, RecursionError):
        pass
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"ref": _handles.add(value), "exception": _builtin_base(value)}
    return {"ref": _handles.add(value)}


class _OutputLimit(BaseException):
    pass


class _Capture(_io.StringIO):
    """What the program prints during a request, counted against the run's output budget (`max_output_bytes`)."""

    left = 1 << 20

    def write(self, text):
        _Capture.left -= len(text)
        if _Capture.left < 0:
            raise _OutputLimit()
        return super().write(text)


def _captured(action):
    """Run `action()` with stdout and stderr captured: the reply (value or exception, and the output)."""
    saved = _sys.stdout, _sys.stderr
    out, err = _Capture(), _Capture()
    _sys.stdout, _sys.stderr = out, err
    try:
        reply = {"ok": _encode(action())}
    except _OutputLimit:
        reply = {"output_limit": True}
    except MemoryError:
        _sys.stdout, _sys.stderr = saved
        out = err = None
        reply = {"raise": {"cls": "MemoryError", "ref": None, "base": "MemoryError", "name": "MemoryError",
                           "args": [], "text": ""}}  # fmt: skip
    except BaseException as exc:  # the program's exception, any kind, goes to the judge
        reply = {"raise": _exception(exc)}
    finally:
        _sys.stdout, _sys.stderr = saved
    reply["out"] = out.getvalue() if out is not None else ""
    reply["err"] = err.getvalue() if err is not None else ""
    return reply


def _script(code, prelude_code, stdin):
    def action():
        namespace = {"__name__": "__main__", "__builtins__": _builtins}
        saved = _sys.stdin
        _sys.stdin = _io.StringIO(stdin)
        try:
            if prelude_code is not None:
                exec(prelude_code, namespace)
            exec(code, namespace)
        except SystemExit as exit:
            if exit.code not in (None, 0):
                raise
        finally:
            _sys.stdin = saved
        return _sys.stdout.getvalue()

    return action


def _serve(code, prelude_code):
    while True:
        try:
            request = wire_receive(_REQUESTS, 1 << 28)
        except EOFError:
            return
        op = request.get("op")
        try:
            if op == "script":
                stdin = request.get("stdin")
                if type(stdin) is not str:
                    raise WireError("stdin must be text")
                reply = _captured(_script(code, prelude_code, stdin))
            else:
                target = _handles.get(request.get("ref"))
                if op == "call":
                    args = _decode({"list": request["args"]})
                    kwargs = _decode({"dict": request["kwargs"]})
                    reply = _captured(lambda: target(*args, **kwargs))
                elif op == "getattr":
                    reply = _captured(lambda: getattr(target, request["name"]))
                elif op == "setattr":
                    value = _decode(request["value"])
                    reply = _captured(lambda: setattr(target, request["name"], value))
                elif op == "iter":
                    reply = _captured(lambda: iter(target))
                elif op == "next":
                    reply = _captured(lambda: next(target))
                else:
                    raise WireError("unknown request %r" % (op,))
        except Exception as exc:  # a malformed request: tell the judge, keep serving
            reply = {"raise": _exception(exc), "out": "", "err": ""}
        wire_send(_REPLIES, reply)


def _main():
    limits = wire_loads(_sys.argv[1])
    _limits(limits)
    wire_send(_REPLIES, {"started": True})  # before any of the program's code: the judge knows the sandbox is up
    _Capture.left = int(limits["max_output_bytes"])
    job = wire_receive(0, 1 << 28)
    null = open("/dev/null", "rb")
    _sys.stdin = null
    import os

    os.dup2(null.fileno(), 0)
    program, prelude, script = job["program"], job.get("prelude") or "", bool(job.get("script"))
    try:
        prelude_code = compile(prelude, "prelude.py", "exec") if prelude else None
        code = compile(program, "program.py", "exec")
    except (SyntaxError, ValueError, OverflowError) as err:
        wire_send(_REPLIES, {"syntax_error": str(err)[:_MAX_TEXT]})
        return
    except MemoryError:
        wire_send(_REPLIES, {"memory": True})
        return
    if script:
        wire_send(_REPLIES, {"names": {}})
        _serve(code, prelude_code)
        return
    namespace = {"__name__": "__main__", "__builtins__": _builtins}
    reply = _captured(lambda: exec(prelude_code, namespace) if prelude_code is not None else None)
    if "ok" in reply:
        reply = _captured(lambda: exec(code, namespace))
    if "ok" not in reply:  # it raised, or printed past the budget: what it printed goes nowhere
        wire_send(_REPLIES, {"import_error": reply.get("raise"), "output_limit": "output_limit" in reply})
        _serve(code, prelude_code)
        return
    names = {}
    missing = object()
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or (name.startswith("__") and name.endswith("__")):
            continue
        if getattr(_builtins, name, missing) is value:  # `from builtins import *` of a prelude: not the program's
            continue
        names[name] = _describe(value)
    wire_send(_REPLIES, {"names": names})
    _serve(code, prelude_code)


_main()
