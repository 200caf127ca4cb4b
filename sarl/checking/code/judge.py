"""The trusted side of a code run (`sarl.checking.code.sandbox`): runs the tests and computes the verdict.

Run as `python -I -S -c <wire.py + this file>` in a process of its own that no program ever runs in; never
imported by the project. It is long-lived, one per worker of the parent: descriptor 0 is a Unix socket to the
parent, which sends each program's job as one message carrying the two pipe ends to that program's runner
(SCM_RIGHTS) followed by one frame (the tests, the prelude, the CPU limit); the verdict goes back on the socket as
one frame, and the judge waits for the next job. Everything of a job is dropped after it (its namespace, its
pipes, the program's exception classes, its counters, the tests' stdout and stderr): only modules the tests imported
stay loaded. The CPU limit is the job's own (its soft RLIMIT_CPU is set to the time used so far plus the limit):
past it the kernel's SIGXCPU ends this process, and the parent starts another. For each job it runs the prelude
itself, and binds each top-level name the program reported (the reply pipe) into the tests' namespace:
a plain value as that value, a stdlib module the program imported under its own name as this process's module,
a function, class or object as a `Remote` handle. Names the prelude defines and builtins are never the
program's: the tests see this process's `is_palindrome`, `len` and `all`, whatever the program redefined.

Then each top-level statement of the tests runs here (decisions §8: each `assert` is one test; other statements
are setup, and a failed setup fails the asserts after it). Calling a handle, reading its attributes or
iterating it asks the program (the request pipe) and gets plain data back (`wire`: fresh ints, strings,
lists ...) or a new handle; the exception the program raised comes back as the builtin class of that name (or a
class made here for the program's own). A handle cannot be compared, hashed or tested for truth (that raises),
so every verdict is computed on plain data by code that the program cannot reach. Stdin problems get
`run_program(stdin) -> stdout`. The verdict goes on a pipe of its own as one frame.
"""

import _ast
import builtins as _builtins
import resource as _resource
import sys as _sys

_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST: compile() parses to `_ast` nodes without importing `ast` (3.7 ms saved)

import _socket  # noqa: E402  (the control socket: recv_fds without the `socket` module's imports)

_REQUESTS = _REPLIES = -1  # the current job's pipes to its runner (set per job by _serve)
_SAFE_EXCEPTIONS = {
    name: cls for name, cls in vars(_builtins).items() if isinstance(cls, type) and issubclass(cls, Exception)
}
_EXITS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")
_ITERATION_ENDS = ("StopIteration", "StopAsyncIteration")  # from a call, they would end a test's map() early
_NOISY_MODULES = frozenset(
    ("antigravity", "this", "__hello__", "__phello__", "turtle", "turtledemo", "tkinter", "idlelib")
)
_STATE = {"gone": False, "memory": False, "output_limit": False, "max_bytes": 1 << 24, "calls": 0, "problem": ""}
_CLASSES = {}  # the program's exception classes (handle id) -> the class made here


# These three derive from BaseException, so a test's `except Exception` or `pytest.raises(Exception)` never takes
# them for an expected error: a program that dies, exits or answers with an object cannot pass that way.
class ProgramError(BaseException):
    """The program could not answer: its process is gone, or it sent what is not plain data."""


class ProgramExit(BaseException):
    """The program raised SystemExit, KeyboardInterrupt or GeneratorExit."""


class NotPlainData(BaseException):
    """A program's object (a handle) was compared, hashed or tested for truth: only plain data can be judged."""


class CannotSend(BaseException):
    """A test passed the program a value the wire does not carry: the test fails (a judge's error is never the
    program's behaviour, so no `pytest.raises(TypeError)` can take it for the program's TypeError)."""


def _text(value, limit=240):
    """`str(value)`, bounded; the type's name when even that raises (an int past the digit limit, a program's
    exception whose __str__ was made to fail): the judge's reading of program-shaped data never raises."""
    try:
        text = str(value)
    except BaseException:
        try:
            return "<%s>" % type(value).__name__
        except BaseException:
            return "<unprintable>"
    return text[:limit]


def _refuse(self, *args):
    raise NotPlainData("%r is the program's object, not plain data: it cannot be compared or tested" % (self,))


class Remote:
    """A handle to an object of the program: call it, read or set its attributes, iterate it."""

    __slots__ = ("_sandbox_ref",)

    def __init__(self, ref):
        object.__setattr__(self, "_sandbox_ref", ref)

    def __repr__(self):
        return "<program object #%d>" % self._sandbox_ref

    def __call__(self, *args, **kwargs):
        encoded = [[_send_value(k), _send_value(v)] for k, v in kwargs.items()]
        return _ask(
            {"op": "call", "ref": self._sandbox_ref, "args": _send_value(list(args))["list"], "kwargs": encoded}
        )

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy, pickle and friends probe for protocols: the program has none here
        return _ask({"op": "getattr", "ref": self._sandbox_ref, "name": name})

    def __setattr__(self, name, value):
        _ask({"op": "setattr", "ref": self._sandbox_ref, "name": name, "value": _send_value(value)})

    def __iter__(self):
        return _ask({"op": "iter", "ref": self._sandbox_ref})

    def __next__(self):
        return _ask({"op": "next", "ref": self._sandbox_ref})

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _refuse
    __contains__ = __getitem__ = __index__ = __int__ = __float__ = __complex__ = _refuse  # no __len__: list() asks


def _remote(ref):
    return Remote(ref)


def _send_value(value):
    def other(obj):
        if type(obj) is Remote:
            return object.__getattribute__(obj, "_sandbox_ref")
        raise WireError("a %s cannot be sent to the program (plain data only)" % type(obj).__name__)

    try:
        return wire_encode(value, other)
    except (WireError, RecursionError) as err:
        raise CannotSend(_text(err)) from None


def _str_field(info, key):
    value = info.get(key)
    return value if type(value) is str else None


def _exception_class(info):
    ref = info.get("ref")
    if ref is None:
        name = _str_field(info, "cls")
        if name in _SAFE_EXCEPTIONS:
            return _SAFE_EXCEPTIONS[name]
        if name in _EXITS:
            return ProgramExit
        return ProgramError
    if type(ref) is not int:
        return ProgramError
    if ref not in _CLASSES:
        base = _SAFE_EXCEPTIONS.get(_str_field(info, "base"), Exception)
        name = _str_field(info, "name")
        name = name if name is not None and name.isidentifier() else "ProgramException"
        _CLASSES[ref] = type(name, (base,), {"__module__": "program"})
    return _CLASSES[ref]


def _program_exception(info, op):
    """The exception the program raised, made here from its report (only its fields of the right types are read)."""
    if type(info) is not dict:
        return ProgramError("the program sent a malformed exception")
    cls_name = _str_field(info, "cls")
    if op != "next" and cls_name in _ITERATION_ENDS:  # only an iterator's next() may end an iteration
        return ProgramError("the program raised %s outside an iterator's next()" % cls_name)
    cls = _exception_class(info)
    if cls is _SAFE_EXCEPTIONS.get("MemoryError"):
        _STATE["memory"] = True
    text = (_str_field(info, "text") or "")[:500]
    try:
        args = wire_decode(info.get("args")) if info.get("args") is not None else [text]
        return cls(*args) if type(args) is list else cls(text)
    except Exception:
        return ProgramError("%s: %s" % (_text(info.get("name"), 200), text))


def _outcome(reply, op):
    """(True, the value) or (False, the exception to raise) from the program's reply to `op`."""
    if type(reply) is not dict:
        return False, ProgramError("the program sent a malformed reply")
    if reply.get("output_limit"):
        _STATE["gone"] = _STATE["output_limit"] = True  # no further request: the run is over
        return False, ProgramError("the program printed more than the output limit")
    if op != "script":  # what the program printed, for capsys (a script's output is its value)
        for stream, key in ((_sys.stdout, "out"), (_sys.stderr, "err")):
            if type(reply.get(key)) is str and reply[key] and stream not in (_REAL_STDOUT, _REAL_STDERR):
                stream.write(reply[key])
    if "raise" in reply:
        return False, _program_exception(reply["raise"], op)
    if "ok" not in reply:
        return False, ProgramError("the program sent a malformed reply")
    try:
        return True, wire_decode(reply["ok"], _remote)
    except WireError as err:
        return False, ProgramError("the program returned what is not plain data: %s" % _text(err))


def _ask(request):
    if _STATE["gone"]:
        raise ProgramError("the program's process has ended")
    _STATE["calls"] += 1
    try:
        wire_send(_REQUESTS, request)
        reply = wire_receive(_REPLIES, _STATE["max_bytes"])
    except (EOFError, OSError):
        _STATE["gone"] = True
        raise ProgramError("the program's process has ended") from None
    except WireError as err:
        _STATE["gone"], _STATE["problem"] = True, _text(err, 300)  # the stream cannot be resynchronised
        raise ProgramError(_text(err, 300)) from None
    try:  # program-shaped data: whatever the judge cannot handle in it is the program's failure, never the judge's
        ok, outcome = _outcome(reply, request["op"])
    except MemoryError:
        _STATE["memory"] = True
        raise ProgramError("the program's reply exhausted the judge's memory") from None
    except Exception as err:
        raise ProgramError("the judge cannot read the program's reply (%s)" % _text(err)) from None
    if ok:
        return outcome
    raise outcome


def run_program(stdin):
    """Stdin problems: the program run as a script with `stdin` as its standard input; its standard output."""
    if type(stdin) is not str:
        raise TypeError("run_program takes the standard input as a str")
    out = _ask({"op": "script", "stdin": stdin})
    if type(out) is not str:
        raise ProgramError("the program's output is not text")
    return out


def _referenced(*sources):
    """The names the tests and the prelude use: the only module names the judge binds for the program."""
    out = set()
    for source in sources:
        if source:
            for node in _walk(compile(source, "<tests>", "exec", _ONLY_AST)):
                if type(node) is _ast.Name:
                    out.add(node.id)
    return out


def _walk(node):
    todo = [node]
    while todo:
        node = todo.pop()
        yield node
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, _ast.AST))
            elif isinstance(value, _ast.AST):
                todo.append(value)


def _bind(namespace, names, protected, wanted):
    """The program's top-level names into the tests' namespace. A stdlib module the program imported is bound only
    under a name the tests or the prelude use (`wanted`), and only if it imports here: the modules the judge
    imports are chosen by the tests, never by the program's names."""
    for name, desc in names.items():
        if type(name) is not str or not name.isidentifier() or name in protected or hasattr(_builtins, name):
            continue
        if name.startswith("__") and name.endswith("__"):  # __builtins__, __name__ ...: the judge's own
            continue
        if type(desc) is not dict:
            continue
        if "module" in desc:
            module = desc["module"]
            if type(module) is str and (module == name or module.startswith(name + ".")) and name in wanted:
                if name in _sys.stdlib_module_names and name not in _NOISY_MODULES:
                    try:
                        namespace[name] = __import__(name)
                    except Exception:  # not on this platform (msvcrt), or it fails to import: the name stays unbound
                        continue
        elif "value" in desc:
            try:
                namespace[name] = wire_decode(desc["value"])
            except WireError:
                continue
        elif type(desc.get("ref")) is int:
            if "exception" in desc:
                namespace[name] = _exception_class({"ref": desc["ref"], "base": desc["exception"], "name": name})
            else:
                namespace[name] = Remote(desc["ref"])


def _where(exc, stmt):
    return ("%s: %s" % (_text(type(exc).__name__, 80), _text(exc)))[:240] + " (tests line %d)" % stmt.lineno


def _judge(job):
    namespace = {"__name__": "__main__", "__builtins__": _builtins}
    prelude, tests = job.get("prelude") or "", job["tests"]
    if prelude:
        exec(compile(prelude, "prelude.py", "exec"), namespace)
    protected = set(namespace)
    if job.get("script"):
        namespace["run_program"] = run_program
    statements = compile(tests, "tests.py", "exec", _ONLY_AST).body
    wanted = _referenced(prelude, tests)
    asserts = sum(isinstance(s, _ast.Assert) for s in statements)
    verdict = {"kind": "ran", "passed": 0, "asserts": asserts, "all_ran": True, "detail": ""}
    try:  # the runner says it started before any of the program's code runs: none of this is the program's doing
        started = wire_receive(_REPLIES, 1 << 10)
    except (EOFError, OSError, WireError) as err:
        started = _text(err)
    if started != {"started": True}:
        return {**verdict, "kind": "harness", "all_ran": False, "detail": "the sandbox did not start (%s)" % started}
    try:
        return _judge_program(namespace, protected, wanted, statements, verdict)
    except MemoryError:
        raise
    except Exception as err:  # the judge could not handle what the program reported: the program's failure
        return {**verdict, "all_ran": False, "detail": "the judge cannot read the program's report (%s)" % _text(err)}


def _judge_program(namespace, protected, wanted, statements, verdict):
    try:
        ready = wire_receive(_REPLIES, _STATE["max_bytes"])
    except (EOFError, OSError, WireError) as err:
        _STATE["gone"] = True
        ready = {"import_error": {"name": "ProgramError", "text": "no report from the program (%s)" % _text(err)}}
    if type(ready) is not dict:
        ready = {"import_error": {"name": "ProgramError", "text": "a malformed report"}}
    if "syntax_error" in ready:
        return {**verdict, "kind": "syntax_error", "all_ran": False, "detail": _text(ready["syntax_error"], 300)}
    if "memory" in ready:
        _STATE["memory"] = True
        return {**verdict, "all_ran": False, "detail": "MemoryError while compiling"}
    if "import_error" in ready:  # the program raised (or printed past the limit) while it ran: every test fails
        info = ready["import_error"] if type(ready["import_error"]) is dict else {}
        _STATE["output_limit"] = ready.get("output_limit") is True
        if info.get("cls") == "MemoryError":
            _STATE["memory"] = True
        return {**verdict, "all_ran": False, "detail": "the program raised %s" % _text(info.get("name"), 200)}
    _bind(namespace, ready.get("names") if type(ready.get("names")) is dict else {}, protected, wanted)
    for stmt in statements:
        try:
            exec(compile(_ast.Module([stmt], []), "tests.py", "exec"), namespace)
        except MemoryError:
            _STATE["memory"] = True
            verdict["all_ran"] = False
            verdict["detail"] = verdict["detail"] or "MemoryError (tests line %d)" % stmt.lineno
            break
        except BaseException as exc:  # a failing test statement, whatever it raised
            verdict["all_ran"] = False
            verdict["detail"] = verdict["detail"] or _where(exc, stmt)
            if not isinstance(stmt, _ast.Assert):
                break  # a setup statement failed: the asserts after it count as failed
        else:
            verdict["passed"] += isinstance(stmt, _ast.Assert)
    return verdict


def _one(job):
    """One job's verdict, from a clean state."""
    _STATE.update(gone=False, memory=False, output_limit=False, calls=0, problem="")
    _CLASSES.clear()
    used = _resource.getrusage(_resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime) + 1
    hard = _resource.getrlimit(_resource.RLIMIT_CPU)[1]  # unlimited: each job's soft limit is set from here
    _resource.setrlimit(_resource.RLIMIT_CPU, (spent + int(job["cpu_s"]), hard))  # SIGXCPU ends this process
    try:
        verdict = _judge(job)
    except MemoryError:
        verdict = {"kind": "ran", "passed": 0, "asserts": 0, "all_ran": False, "detail": "MemoryError in the judge"}
        _STATE["memory"] = True
    finally:
        _sys.stdout, _sys.stderr = _REAL_STDOUT, _REAL_STDERR  # whatever a test's capture left
    verdict.update(
        gone=_STATE["gone"],
        memory=_STATE["memory"],
        output_limit=_STATE["output_limit"],
        calls=_STATE["calls"],
        problem=_STATE["problem"],
    )
    return verdict


def _main():
    global _REQUESTS, _REPLIES
    limits = wire_loads(_sys.argv[1])
    for name, value in limits["rlimits"].items():
        _resource.setrlimit(getattr(_resource, name), (value, value))
    _STATE["max_bytes"] = int(limits["max_value_bytes"])
    control = _socket.socket(fileno=0)
    while True:
        try:
            _, fds, _, _ = _recv_fds(control)
        except EOFError:  # the parent is done with this judge
            return
        _REQUESTS, _REPLIES = fds
        try:
            job = wire_receive(0, 1 << 30)  # from the parent: trusted
            verdict = _one(job)
        finally:
            _wire_os.close(_REQUESTS)
            _wire_os.close(_REPLIES)
            _REQUESTS = _REPLIES = -1
        wire_send(0, verdict)


def _recv_fds(control):
    """The next job's message: one byte and the two pipe ends (SCM_RIGHTS); EOFError when the parent closed."""
    data, ancillary, flags, addr = control.recvmsg(1, _socket.CMSG_SPACE(2 * 4))
    if not data:
        raise EOFError
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i : i + 4], _sys.byteorder) for i in range(0, len(payload) - 3, 4)]
    if len(fds) != 2:
        raise RuntimeError("a job without its two pipes")
    return data, fds, flags, addr


_REAL_STDOUT, _REAL_STDERR = _sys.stdout, _sys.stderr
_main()
