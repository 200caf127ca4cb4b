"""Test doubles shared by the sarl tests."""

import hashlib
import sys
from pathlib import Path

import numpy as np

from sarl.embed.base import Embedder
from sarl.interface import RewardFunction, RewardOutput


class KeywordEmbedder(Embedder):
    """Deterministic test embedder: a step's vector is the one-hot of the first keyword it
    contains (plan / calc / check / answer, else 'other') plus a small hash-seeded jitter.
    Texts listed in `bad` get the given raw vector instead (NaN, zero, wrong size)."""

    KEYWORDS = ("plan", "calc", "check", "answer")

    def __init__(self, dim: int = 16, bad: dict | None = None):
        super().__init__(dim=dim)
        self.size = dim
        self.bad = bad or {}
        self.calls: list[list[str]] = []

    def _embed_unique(self, texts):
        self.calls.append(list(texts))
        out = []
        for t in texts:
            if t in self.bad:
                out.append(np.asarray(self.bad[t], dtype=np.float64))
                continue
            v = np.zeros(self.size)
            hit = next((i for i, k in enumerate(self.KEYWORDS) if k in t.lower()), len(self.KEYWORDS))
            v[hit] = 1.0
            seed = int.from_bytes(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest()[:4], "little")
            v += np.random.default_rng(seed).normal(scale=0.01, size=self.size)
            out.append(v)
        return out, {}


class PromptRecorder(RewardFunction):
    """A prompt-dependent reward test double (like MaxFlow, `needs_prompt`): scores 1 and records every
    prompt it is given. `name` only makes configs differ (the verl bridge builds one object per config)."""

    needs_prompt = True

    def __init__(self, name: str = "") -> None:
        super().__init__()
        self.name = name
        self.prompts: list[str] = []

    def score(self, batch):
        self.prompts.extend(batch.prompts)
        return [RewardOutput(1.0) for _ in batch.responses]


# A stand-in for `python -m vllm.entrypoints.openai.api_server`: /health, and /v1/embeddings with 3-d vectors.
# With FAKE_PID_DIR set it writes its pid to FAKE_PID_DIR/vllm.pid once it serves.
FAKE_VLLM = r"""
import argparse, json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
ap = argparse.ArgumentParser(); ap.add_argument("-m"); ap.add_argument("--port", type=int); ap.add_argument("--host")
args, _ = ap.parse_known_args()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = [{"index": i, "embedding": [1.0 + len(t), 2.0, 3.0]} for i, t in enumerate(body["input"])]
        out = json.dumps({"data": data}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
server = HTTPServer((args.host, args.port), H)
if os.environ.get("FAKE_PID_DIR"):
    with open(os.path.join(os.environ["FAKE_PID_DIR"], "vllm.pid"), "w") as f:
        f.write(str(os.getpid()))
print("fake vllm on", args.port, flush=True)
server.serve_forever()
"""


def fake_vllm_python(folder: Path) -> Path:
    """An executable to pass as `embedding_server.python`: it runs FAKE_VLLM (same pid, by exec) on its arguments."""
    (folder / "fake_vllm.py").write_text(FAKE_VLLM)
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {folder / "fake_vllm.py"} "$@"\n')
    python.chmod(0o755)
    return python
