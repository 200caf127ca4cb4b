"""A stand-in for the Hugging Face Hub on loopback: the few HTTP routes `hf download` (huggingface_hub's
snapshot_download) and `datasets.load_dataset` use, serving local directories under exact repo ids. A test points
HF_ENDPOINT at it and runs the real download code, with no network:

    with StandinHub({("model", "Qwen/Qwen3-4B"): tiny_policy_dir, ("dataset", "math-ai/aime25"): folder}) as hub:
        env["HF_ENDPOINT"] = hub.url

Routes: a repo's info (`/api/{models,datasets}/ID[/revision/REV]`), its file tree (`/api/datasets/ID/tree/REV[/P]`),
paths-info (`POST /api/datasets/ID/paths-info/REV`) and file downloads (`[/datasets]/ID/resolve/REV/PATH`, HEAD and
GET). Every repo has one commit, a hash of its files; anything else is a 404 with the Hub's error header, as the Hub
answers a repo or file that does not exist. Each request is recorded (`requests`), so a test can check what was
asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

KINDS = {"models": "model", "datasets": "dataset"}


class Repo:
    def __init__(self, kind: str, repo_id: str, root: Path):
        self.kind, self.repo_id, self.root = kind, repo_id, Path(root)
        self.files = sorted(
            str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file() and ".cache" not in p.parts
        )
        digest = hashlib.sha1()
        for name in self.files:
            digest.update(name.encode() + b"\0" + hashlib.sha1((self.root / name).read_bytes()).digest())
        self.sha = digest.hexdigest()

    def oid(self, name: str) -> str:
        data = (self.root / name).read_bytes()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id, as the Hub gives

    def entry(self, name: str) -> dict:
        return {"type": "file", "path": name, "size": (self.root / name).stat().st_size, "oid": self.oid(name)}

    def info(self) -> dict:
        return {
            "id": self.repo_id,
            "sha": self.sha,
            "private": False,
            "gated": False,
            "disabled": False,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "siblings": [{"rfilename": name} for name in self.files],
            "tags": [],
            "cardData": {},
        }

    def tree(self, path: str, recursive: bool) -> list[dict]:
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        out: dict[str, dict] = {}
        for name in self.files:
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if recursive or "/" not in rest:
                out[name] = self.entry(name)
            else:
                folder = prefix + rest.split("/", 1)[0]
                out.setdefault(folder, {"type": "directory", "path": folder, "oid": self.sha, "size": 0})
            if recursive:  # every folder on the way, as the Hub lists them
                parts = rest.split("/")[:-1]
                for i in range(len(parts)):
                    folder = prefix + "/".join(parts[: i + 1])
                    out.setdefault(folder, {"type": "directory", "path": folder, "oid": self.sha, "size": 0})
        return sorted(out.values(), key=lambda e: e["path"])


class StandinHub:
    """The server, on 127.0.0.1 at a free port, in a thread of this process; a context manager."""

    def __init__(self, repos: dict[tuple[str, str], Path]):
        self.repos = {(kind, repo_id): Repo(kind, repo_id, root) for (kind, repo_id), root in repos.items()}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the test reads `requests`
                pass

            def do_GET(self) -> None:
                hub._handle(self, head=False)

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_POST(self) -> None:
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "StandinHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    # -- routes ---------------------------------------------------------------------------------

    def _repo(self, kind: str, parts: list[str]) -> tuple[Repo | None, list[str]]:
        """The repo named by the first one or two of `parts` (an id is `name` or `org/name`), and the rest."""
        for n in (2, 1):
            repo = self.repos.get((kind, "/".join(parts[:n])))
            if repo is not None:
                return repo, parts[n:]
        return None, parts

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlsplit(h.path)
        self.requests.append(f"{h.command} {url.path}")
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if h.command == "POST":
            length = int(h.headers.get("Content-Length") or 0)
            body = h.rfile.read(length).decode() if length else ""
        if parts[0] == "api" and len(parts) > 2 and parts[1] in KINDS:
            repo, rest = self._repo(KINDS[parts[1]], parts[2:])
            if repo is None:
                return self._missing(h, "Repository not found", "RepoNotFound")
            if not rest or rest[0] == "revision":
                return self._json(h, repo.info(), head)
            if rest[0] == "tree":
                return self._json(h, repo.tree("/".join(rest[2:]), query.get("recursive") == ["true"]), head)
            if rest[0] == "paths-info":
                form = "=" in body and not body.lstrip().startswith("{")
                fields = parse_qs(body) if form else json.loads(body or "{}")
                paths = fields.get("paths") or []
                entries = []
                for path in [paths] if isinstance(paths, str) else paths:
                    path = path.strip("/")
                    if path in repo.files:
                        entries.append(repo.entry(path))
                    elif any(f.startswith(path + "/") for f in repo.files) or path == "":
                        entries.append({"type": "directory", "path": path, "oid": repo.sha, "size": 0})
                return self._json(h, entries, head)
            return self._missing(h, "Entry not found", "EntryNotFound")
        kind = "dataset" if parts[0] == "datasets" else "model"
        repo, rest = self._repo(kind, parts[1:] if kind == "dataset" else parts)
        if repo is None:
            return self._missing(h, "Repository not found", "RepoNotFound")
        if len(rest) >= 3 and rest[0] == "resolve":
            name = "/".join(rest[2:])
            if name not in repo.files:
                return self._missing(h, "Entry not found", "EntryNotFound", repo.sha)
            data = (repo.root / name).read_bytes()
            h.send_response(200)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(len(data)))
            h.send_header("ETag", f'"{repo.oid(name)}"')
            h.send_header("X-Repo-Commit", repo.sha)
            h.end_headers()
            if not head:
                h.wfile.write(data)
            return None
        return self._missing(h, "Entry not found", "EntryNotFound")

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, obj, head: bool) -> None:
        data = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)

    @staticmethod
    def _missing(h: BaseHTTPRequestHandler, message: str, code: str, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(404)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
