"""`eval.sandbox`: each hostile program is tried for real and ends bounded, counted under its outcome and scored
0, without harming the caller; no sandboxed process outlives a test. Timeouts are 1-2 s."""

import os
import socket
import time
from pathlib import Path

import pytest

from eval.sandbox import Sandbox, check_tests, last_code_block

REPO = Path(__file__).resolve().parents[2]
OK_TEST = "assert True\n"


def sandbox_processes() -> list[int]:
    """Pids of processes running the sandbox's child (its argv carries the limits JSON)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"RLIMIT_NPROC" in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture(autouse=True)
def no_survivors():
    yield
    deadline = time.monotonic() + 3
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == [], "a sandboxed process outlived its run"


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(timeout_s=1.5, memory_mb=512)


@pytest.fixture(scope="module")
def bare():
    """The layers under the audit hook alone (rlimits, uid, namespaces): what code that slips past the hook meets."""
    return Sandbox(timeout_s=1.5, memory_mb=512, audit=False)


def test_passing_failing_and_pass_fraction(sandbox):
    program = "def add(a, b):\n    return a + b if a < 5 else 0\n"
    ok = sandbox.run(program, "assert add(1, 2) == 3\nassert add(2, 2) == 4\n")
    assert (ok.outcome, ok.passed, ok.asserts, ok.score("all_pass")) == ("passed", 2, 2, 1.0)
    half = sandbox.run(program, "assert add(1, 2) == 3\nassert add(7, 1) == 8\nassert add(0, 0) == 0\nx = 1\n")
    assert (half.outcome, half.passed, half.asserts) == ("failed", 2, 3)
    assert half.score("all_pass") == 0.0 and half.score("pass_fraction") == pytest.approx(2 / 3)
    # a setup statement that raises ends the run: the asserts after it count as failed
    setup = sandbox.run(program, "assert add(1, 1) == 2\nundefined_name()\nassert add(0, 1) == 1\n")
    assert (setup.outcome, setup.passed, setup.asserts) == ("failed", 1, 2)


def test_tests_without_top_level_asserts_count_as_one_test(sandbox):
    check = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n\ncheck(square)\n"
    good = sandbox.run("def square(x):\n    return x * x\n", check)
    bad = sandbox.run("def square(x):\n    return 2 * x\n", check)
    assert good.outcome == "passed" and good.score("pass_fraction") == 1.0
    assert bad.outcome == "failed" and bad.score("pass_fraction") == 0.0


def test_infinite_loop_times_out(sandbox):
    result = sandbox.run("while True:\n    pass\n", OK_TEST)
    assert result.outcome == "timeout" and result.score() == 0.0
    assert result.wall_s < sandbox.timeout_s + 1.5


def test_sleeping_program_times_out_on_the_wall_clock(sandbox):
    result = sandbox.run("import time\ntime.sleep(60)\n", OK_TEST)
    assert result.outcome == "timeout" and result.wall_s < sandbox.timeout_s + 1.5


def test_fork_bomb_is_blocked(sandbox):
    result = sandbox.run("import os\nwhile True:\n    os.fork()\n", OK_TEST)
    assert result.outcome == "blocked" and result.detail == "os.fork"


def test_fork_bomb_past_the_hook_is_bounded_by_the_process_limit(bare):
    if bare.drop_to is None and os.geteuid() == 0:
        pytest.skip("RLIMIT_NPROC binds no root process")
    program = (
        "import os, time\nn = 0\nfor _ in range(10000):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nprint('forked', n, flush=True)\n"
    )
    result = bare.run(program, OK_TEST)
    forked = int(result.output.split()[1])
    assert result.outcome == "passed" and 0 < forked <= bare.max_processes
    assert result.wall_s < bare.timeout_s  # the sleeping children did not hold the run open


def test_huge_allocation_hits_the_memory_limit(sandbox):
    result = sandbox.run("x = bytearray(8 * 1024 ** 3)\n", OK_TEST)
    assert result.outcome == "memory" and result.score() == 0.0
    slow = sandbox.run("x = []\nwhile True:\n    x.append(' ' * 10 ** 6)\n", OK_TEST)
    assert slow.outcome == "memory"


@pytest.mark.parametrize(
    "program, event",
    [
        ("import os\nos.system('echo hi')\n", "os.system"),
        ("import subprocess\nsubprocess.run(['true'])\n", "import__posixsubprocess"),
        ("import os\nos.execv('/bin/true', ['true'])\n", "os.exec"),
        ("import ctypes\n", "import_ctypes"),
        ("import gc\ngc.get_objects()\n", "gc.get_objects"),
        ("import sys\nsys._getframe(0)\n", "sys._getframe"),
    ],
)
def test_processes_ctypes_and_introspection_are_blocked(sandbox, program, event):
    result = sandbox.run(program, OK_TEST)
    assert result.outcome == "blocked" and result.detail.startswith(event)


def test_reading_files_outside_the_sandbox_is_blocked(sandbox):
    for path in ("/etc/passwd", str(REPO / "pyproject.toml")):
        result = sandbox.run(f"data = open({path!r}).read()\nprint(data)\n", OK_TEST)
        assert result.outcome == "blocked" and path in result.detail and result.output == b""
    listing = sandbox.run(f"import os\nos.listdir({str(REPO)!r})\n", OK_TEST)
    assert listing.outcome == "blocked"


def test_writing_outside_the_sandbox_is_blocked(sandbox, bare, tmp_path):
    outside = tmp_path / "escaped.txt"
    in_repo = REPO / "sandbox_escape_probe.txt"
    for target in (outside, in_repo):
        result = sandbox.run(f"open({str(target)!r}, 'w').write('x')\n", OK_TEST)
        assert result.outcome == "blocked" and not target.exists()
        removal = sandbox.run(f"import os\nos.remove({str(REPO / 'pyproject.toml')!r})\n", OK_TEST)
        assert removal.outcome == "blocked" and (REPO / "pyproject.toml").exists()
    if bare.drop_to is not None:  # past the hook, the unprivileged uid cannot write the repo
        result = bare.run(f"open({str(in_repo)!r}, 'w').write('x')\n", OK_TEST)
        assert result.outcome == "failed" and not in_repo.exists()


def test_the_program_gets_a_private_directory_and_a_minimal_environment(sandbox):
    program = "import os\nprint(os.getcwd(), os.environ['HOME'], sorted(os.environ))\nopen('own.txt', 'w').write('x')\n"
    result = sandbox.run(program, "assert open('own.txt').read() == 'x'\n")
    assert result.outcome == "passed"
    cwd, home, keys = result.output.decode().split(" ", 2)
    assert cwd == home and not Path(cwd).exists()  # removed afterwards
    assert set(eval(keys)) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}


def test_killing_the_parent_does_not_work(sandbox, bare):
    for program in ("import os\nos.kill(os.getppid(), 9)\n", f"import os\nos.kill({os.getpid()}, 9)\n"):
        assert sandbox.run(program, OK_TEST).outcome == "blocked"
        if bare.uses_namespaces() or bare.drop_to is not None:  # past the hook: invisible (pid ns) or not ours
            assert bare.run(program + "import time\ntime.sleep(0.1)\n", OK_TEST).outcome in ("failed", "passed")
    assert os.getpid() > 0  # still here


def test_printing_a_gigabyte_is_cut_off(sandbox):
    result = sandbox.run("import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)\n", OK_TEST)
    assert result.outcome == "output_limit" and len(result.output) <= 4096
    assert result.wall_s < sandbox.timeout_s


def test_syntax_error(sandbox):
    result = sandbox.run("def f(:\n    return 1\n", OK_TEST)
    assert result.outcome == "syntax_error" and result.score("pass_fraction") == 0.0


def test_network_connection_to_a_loopback_server_fails(sandbox, bare, closing_server):
    port = closing_server.port
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5).close()\n"
    assert sandbox.run(program, OK_TEST).outcome == "blocked"
    if bare.uses_namespaces():  # past the hook: a fresh network namespace has no route to the host's loopback
        assert bare.run(program, OK_TEST).outcome == "failed"
    with socket.create_connection(("127.0.0.1", port), timeout=1):  # the server itself works
        pass
    time.sleep(0.2)
    assert closing_server.accepted == 1


def test_a_forged_verdict_does_not_count(sandbox):
    forge = (
        "import os\nfor fd in range(3, 12):\n    try:\n        os.write(fd, b'0 ran 9 9 1 -\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n"
    )
    result = sandbox.run(forge, "assert False\n")
    assert result.outcome == "failed" and result.score() == 0.0


def test_a_broken_harness_is_a_sandbox_error():
    broken = Sandbox(timeout_s=1, python="/nonexistent/python3")
    result = broken.run("x = 1\n", OK_TEST)
    assert result.outcome == "sandbox_error"
    assert "set python=" in broken.check_ready()


def test_run_many_keeps_the_order_and_bounds_the_concurrency(sandbox):
    jobs = [(f"def f():\n    return {i}\n", f"assert f() == {i if i % 3 else -1}\n") for i in range(9)]
    results = sandbox.run_many(jobs, max_workers=3)
    assert [r.outcome for r in results] == ["failed" if i % 3 == 0 else "passed" for i in range(9)]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="namespaces='maybe' is not valid"):
        Sandbox(namespaces="maybe")
    with pytest.raises(ValueError, match="timeout_s=0 must be positive"):
        Sandbox(timeout_s=0)
    assert check_tests("assert x ==") is not None and check_tests(None) is not None
    assert check_tests("assert 1\n") is None


@pytest.mark.parametrize(
    "text, code",
    [
        ("```python\ndef f():\n    pass\n```", "def f():\n    pass\n"),
        ("a\n```\nx = 1\n```\nthen\n```py\nx = 2\n```\n", "x = 2\n"),
        ("```python\nx = 1\n```\n```bash\nls\n```", "x = 1\n"),  # another language is skipped
        ("```python\nx = 1\n", None),  # unclosed: truncated
        ("no code at all", None),
        (None, None),
    ],
)
def test_last_code_block(text, code):
    assert last_code_block(text) == code
