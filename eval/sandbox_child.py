"""The script the sandboxed interpreter runs (`python -I -S -c <this file's text>`; see `eval.sandbox`).

It imports nothing from the project and is never imported by it. Arguments: the limits as JSON and the
verdict pipe's descriptor; the verdict's nonce arrives on stdin (which is then replaced by /dev/null), the
program and the tests are read from `program.py` and `tests.py` in the working directory (the sandbox's
private directory).

Order: read the nonce, program and tests -> set the resource limits -> install the audit hook -> compile the
program (a SyntaxError ends the run) -> run it -> run each top-level statement of the tests in the same
namespace, counting the `assert` statements that pass -> write one verdict line on the verdict pipe (a
`<nonce> start` line precedes the program: without it the harness, not the program, failed):
`<nonce> <kind> <asserts passed> <asserts> <every statement ran> <blocked event>`.

Not guaranteed: the verdict comes from the process that ran the program; the audit hook keeps frames, the
garbage collector's object lists and ctypes out of the program's reach, which makes forging it hard, not
impossible (an audit hook is not a security boundary: see `eval.sandbox`).
"""

import ast
import json
import os
import resource
import sys


def main():
    write, dumps_int = os.write, str  # bound before the program runs: patching `os` later changes nothing
    nonce = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    limits, verdict_fd = json.loads(sys.argv[1]), int(sys.argv[2])
    root = os.path.realpath(os.getcwd())
    with open("program.py", encoding="utf-8", errors="replace") as f:
        program = f.read()
    with open("tests.py", encoding="utf-8", errors="replace") as f:
        tests = f.read()
    for name, value in limits["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value + (name == "RLIMIT_CPU")))  # SIGXCPU first

    blocked = []
    # reads: the sandbox directory and this interpreter's standard library (imports), nothing else
    stdlib = (os.path.dirname(os.__file__) + os.sep, os.path.dirname(os.path.realpath(os.__file__)) + os.sep)
    readable = (*stdlib, root + os.sep)
    denied = frozenset(limits["denied_events"])
    denied_prefixes = tuple(limits["denied_prefixes"])
    denied_imports = frozenset(limits["denied_imports"])
    # standard-library modules that hand the frame they read back to their caller
    frame_givers = ("/inspect.py", "/traceback.py", "/logging/__init__.py", "/bdb.py", "/pdb.py", "/cgitb.py")
    frame_attrs = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals"))
    path_events = frozenset(("open", "os.listdir", "os.scandir", "glob.glob", "os.mkdir", "shutil.rmtree", "os.chdir"))
    write_events = frozenset(("os.mkdir", "shutil.rmtree", "os.chdir"))

    # Every name the hook uses is bound now, as a default argument: a program that patches `builtins` or `os`
    # afterwards cannot change what the hook sees.
    def inside(path, allowed, isinstance=isinstance, normpath=os.path.normpath, join=os.path.join, fspath=os.fspath):
        if isinstance(path, int):
            return path > 2  # a descriptor the program opened itself; never re-open stdin/out/err
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        full = normpath(join(root, fspath(path))) + "/"
        return full.startswith(allowed)

    busy = []  # the hook itself reads a frame: the events that raises are not judged

    def hook(
        event,
        args,
        isinstance=isinstance,
        len=len,
        set=set,
        all=all,
        inside=inside,
        error=PermissionError,
        getframe=sys._getframe,
    ):
        reason = None
        if event in denied or event.startswith(denied_prefixes):
            reason = event
        elif event == "import" and args[0].split(".")[0] in denied_imports:
            reason = f"import {args[0]}"
        elif event == "sys._getframe":  # namedtuple, enum, typing ask for their caller's frame: allowed
            if busy:
                return
            busy.append(1)
            try:
                caller = getframe(1).f_code.co_filename
            finally:
                busy.pop()
            if not caller.startswith(stdlib) or caller.endswith(frame_givers):
                reason = event
        elif event == "object.__getattr__" and args[1] in frame_attrs and not busy:
            reason = f"{event} {args[1]}"
        elif event in path_events and args and args[0] is not None:
            writing = event in write_events or (
                event == "open" and len(args) > 1 and isinstance(args[1], str) and set("wax+") & set(args[1])
            )
            if event == "open" and len(args) > 2 and isinstance(args[2], int):
                writing = writing or bool(args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND))
            if not inside(args[0], (root + os.sep,) if writing else readable):
                reason = f"{event} {args[0]!r}"
        elif event in ("os.rename", "os.remove", "os.rmdir", "os.truncate", "os.utime") and args:
            if not all(inside(a, (root + os.sep,)) for a in args[:2] if isinstance(a, (str, bytes))):
                reason = f"{event} {args[0]!r}"
        if reason is not None:
            if not blocked:
                blocked.append(reason.replace(" ", "_")[:200])
            raise error(f"sandbox: {reason} is not allowed")

    if limits["audit"]:
        sys.addaudithook(hook)

    write(verdict_fd, f"{nonce} start\n".encode())  # the harness is up: anything after is the program's doing
    statements = ast.parse(tests, "tests.py").body  # checked by the caller before the run
    asserts = sum(isinstance(s, ast.Assert) for s in statements)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    kind, passed, all_ran = "ran", 0, True
    try:
        code = compile(program, "program.py", "exec")
    except (SyntaxError, ValueError):
        kind, all_ran = "syntax_error", False
        statements = []
    except MemoryError:
        kind, all_ran, statements = "memory", False, []
    else:
        try:
            exec(code, namespace)
        except MemoryError:
            kind, all_ran, statements = "memory", False, []
        except BaseException:
            all_ran, statements = False, []
    for stmt in statements:  # decisions §8: each top-level assert is one test; other statements are setup
        try:
            exec(compile(ast.Module([stmt], []), "tests.py", "exec"), namespace)
        except MemoryError:
            kind, all_ran = "memory", False
            break
        except BaseException:
            all_ran = False
            if not isinstance(stmt, ast.Assert):
                break  # a setup statement failed: the asserts after it count as failed
        else:
            passed += isinstance(stmt, ast.Assert)
    if blocked:
        kind = "blocked"
    line = f"{nonce} {kind} {dumps_int(passed)} {dumps_int(asserts)} {int(all_ran)} {blocked[0] if blocked else '-'}\n"
    write(verdict_fd, line.encode())


main()
