"""HTTP embedding client (HTTPEmbedder: base64 transport, reused connections) against a local vLLM CPU
server, versus the same model (the MiniLM shipped for tests) called in-process with sentence-transformers.

Both sides embed the same step texts, with the same number of threads (the server gets OMP_NUM_THREADS
and VLLM_CPU_OMP_THREADS_BIND for it), alternating in-process and HTTP for each repeat; throughput is the
median. The vectors must agree to float32 precision (maximum absolute difference and minimum cosine
printed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.bench.common import alternate, median
from sarl.bench.structure import step_text_stream


def bench_texts(n: int) -> list[str]:
    stream = step_text_stream()
    return [stream[i % len(stream)] + ("" if i < len(stream) else f" ({i // len(stream)})") for i in range(n)]


def run_embed_http(cfg: DictConfig, console: Console) -> dict | None:
    from sarl.embed.http import HTTPEmbedder
    from sarl.embed.local import SentenceTransformerEmbedder, bundled_minilm_path
    from sarl.embed.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, EmbeddingServer

    python = Path(cfg.server_python)
    if not python.exists():
        console.print(f"[yellow]embed_http skipped: {python} not found (run scripts/setup_vllm_cpu.sh)")
        return None
    texts = bench_texts(cfg.texts)
    local = SentenceTransformerEmbedder(batch_size=cfg.batch_size)
    local.embed(texts[:16])  # warm-up
    import torch

    threads = torch.get_num_threads()
    env = {**VLLM_CPU_ENV, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with EmbeddingServer(
        bundled_minilm_path(),
        served_name="minilm",
        python=str(python),
        env=env,
        extra_args=list(VLLM_CPU_ARGS),
        startup_timeout_s=cfg.startup_timeout_s,
    ) as server:
        with HTTPEmbedder(
            url=server.url,
            model="minilm",
            batch_size=cfg.batch_size,
            max_concurrency=cfg.max_concurrency,
            timeout_s=cfg.timeout_s,
        ) as client:
            client.embed(texts[:16])  # warm-up (connection, first request)
            results: dict[str, object] = {}

            def side(name, embedder):
                def fn():
                    results[name] = embedder.embed(texts)

                return fn

            times = alternate({"in_process": side("in_process", local), "http": side("http", client)}, cfg.repeats)
    ref = np.asarray(results["in_process"].vectors, dtype=np.float32)
    got_result = results["http"]
    got = np.asarray(got_result.vectors, dtype=np.float32)
    out = {
        "texts": len(texts),
        "threads": threads,
        "in_process_s": median(times["in_process"]),
        "http_s": median(times["http"]),
        "in_process_times_s": times["in_process"],
        "http_times_s": times["http"],
        "failed": len(got_result.failed),
        "max_abs_diff": float(np.nanmax(np.abs(got - ref))),
        "min_cosine": float(np.nanmin((got * ref).sum(1))),
    }
    out["http_over_in_process_throughput"] = out["in_process_s"] / out["http_s"]
    table = Table(title=f"embedding {len(texts)} step texts with all-MiniLM-L6-v2 on CPU, {threads} thread(s)")
    for col in ("path", "median s", "texts/s", "repeats s"):
        table.add_column(col, justify="right")
    table.add_row(
        "in-process (sentence-transformers)",
        f"{out['in_process_s']:.2f}",
        f"{len(texts) / out['in_process_s']:.0f}",
        " ".join(f"{t:.2f}" for t in times["in_process"]),
    )
    table.add_row(
        "HTTP (vLLM CPU server, base64)",
        f"{out['http_s']:.2f}",
        f"{len(texts) / out['http_s']:.0f}",
        " ".join(f"{t:.2f}" for t in times["http"]),
    )
    console.print(table)
    console.print(
        f"HTTP throughput / in-process: {100 * out['http_over_in_process_throughput']:.0f}% (goal >= 90%); "
        f"max |difference| {out['max_abs_diff']:.2e}, min cosine {out['min_cosine']:.6f}; failed {out['failed']}"
    )
    return out
