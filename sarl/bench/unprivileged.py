"""The code sandbox as a caller that is not root sees it, from a root process: what most cluster users get.

As root the sandbox runs each program as a uid of its own slot; a user who is not root gets the other path (every
program as the caller's uid, in user namespaces the caller makes, no cgroup). `AsUser(uid, settings)` runs a
`Sandbox(**settings)` in a helper process of its own as `uid` (no supplementary group), on an interpreter that uid
can run, importing a world-readable copy of `sarl.checking.code` (stdlib only): the benchmark times that side
(`python -m sarl.bench suite=code_exec`) and the tests try their attacks on it. `run_many` sends jobs to the helper
and returns its results as `RunResult`s; `close` ends it (its fork server and every runner end with it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from sarl.checking.code.sandbox import RunResult, Sandbox, _runnable_by_others

UNPRIVILEGED_UID = 1_400_000_000  # below the root sandbox's slots (uid_base 1.5e9) and above any account's


def unprivileged_uid(k: int = 0) -> int:
    """This process's k-th (0-3) uid for `AsUser`: no other process's, no account's, no root sandbox slot's."""
    if not 0 <= k < 4:
        raise ValueError(f"unprivileged_uid k={k} must be 0-3")
    return UNPRIVILEGED_UID + (os.getpid() % 1_000_000) * 4 + k


CODE = Path(__file__).resolve().parents[1] / "checking" / "code"
HELPER = """import json, sys
sys.path.insert(0, sys.argv[1])
from sarl.checking.code.sandbox import Sandbox
from sarl.checking.code.spawner import Zygote
box = Sandbox(**json.loads(sys.argv[2]))
zygote = box.zygote()
said = {"ready": box.check_ready(), "fork_server": zygote is not None, "note": Zygote.note,
        "isolation": box.isolation, "uid": __import__("os").getuid()}
print(json.dumps(said), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    results = box.run_many([tuple(job) for job in request["jobs"]], request["workers"])
    rows = [dict(r.__dict__, output=r.output.decode("utf-8", "replace")) for r in results]
    print(json.dumps(rows), flush=True)
"""


def python_for_others() -> str | None:
    """An interpreter a uid that is neither root nor in root's groups can run: this one, else python3 on PATH."""
    for path in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if path and _runnable_by_others(path):
            return os.path.realpath(path)
    return None


class AsUser:
    """A Sandbox with `settings` in a helper process running as `uid` (this process must be root)."""

    def __init__(self, uid: int, settings: dict[str, Any]) -> None:
        if os.geteuid() != 0:
            raise PermissionError("AsUser runs a sandbox as another uid: this process must be root")
        python = python_for_others()
        if python is None:
            raise FileNotFoundError("no Python interpreter that other uids can run (python3 on PATH, /usr/bin/python3)")
        settings = dict(settings)
        if not settings.get("bwrap"):  # the helper imports no site-packages: the bubblewrap root's sandbox found
            settings["bwrap"] = Sandbox(**settings).bwrap
        self.uid, self.home = uid, tempfile.mkdtemp(prefix="sarl-as-user-")
        os.chmod(self.home, 0o755)
        package = Path(self.home) / "pkg" / "sarl" / "checking"
        shutil.copytree(CODE, package / "code", ignore=shutil.ignore_patterns("__pycache__"))
        for init in (package.parent / "__init__.py", package / "__init__.py"):
            init.write_text("")
        for path in Path(self.home).rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        work = Path(self.home) / "work"
        work.mkdir()
        os.chown(work, uid, uid)
        self.proc = subprocess.Popen(
            [python, "-I", "-S", "-c", HELPER, str(Path(self.home) / "pkg"), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"},
            user=uid,
            group=uid,
            extra_groups=[],
            text=True,
        )
        self.info: dict[str, Any] = self._reply()

    def _reply(self) -> Any:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.close()
            raise RuntimeError(f"the sandbox helper running as uid {self.uid} ended (exit {self.proc.poll()})")
        return json.loads(line)

    def send(self, jobs: Sequence[tuple[str, str]], max_workers: int = 1) -> None:
        """Hand the helper the jobs (program, tests source) for `Sandbox.run_many`; `run_many` reads the results."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jobs": [list(job) for job in jobs], "workers": max_workers}) + "\n")
        self.proc.stdin.flush()

    def run_many(self, jobs: Sequence[tuple[str, str]], max_workers: int = 1) -> list[RunResult]:
        """`Sandbox.run_many` of the jobs (program, tests source) in the helper."""
        self.send(jobs, max_workers)
        return [RunResult(**dict(row, output=row["output"].encode())) for row in self._reply()]

    def run(self, program: str, tests: str) -> RunResult:
        return self.run_many([(program, tests)])[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.home, ignore_errors=True)
