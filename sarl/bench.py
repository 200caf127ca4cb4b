"""Benchmarks of the structure reward's hot path, measured in one run.

    python -m sarl.bench

1. Clustering + graph stage: `structure_rewards_from_embeddings` on a realistic batch
   against the naive per-response loop (scikit-learn KMeans / HDBSCAN + networkx).
2. Embedding client: HTTPEmbedder against a local vLLM server versus the same model
   called in-process (the HTTP overhead).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from sarl.cluster import cluster_batch, hdbscan_params, kmeans_k
from sarl.graph import graph_metrics_batch, reasoning_map, structure_reward

log = logging.getLogger(__name__)


def synthetic_batch(n: int, steps: int, dim: int, functions: int, noise: float, seed: int) -> list[np.ndarray]:
    """Unit step embeddings: each response revisits a few latent functions in random order."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = max(2, int(rng.normal(steps, steps / 5)))
        centres = rng.normal(size=(functions, dim)).astype(np.float32)
        x = centres[rng.integers(0, functions, m)] + noise * rng.normal(size=(m, dim)).astype(np.float32)
        out.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    return out


def naive_rewards(embeddings: list[np.ndarray], method: str, seed: int = 0) -> tuple[list[float], list[np.ndarray]]:
    """The per-response loop the batched path replaces: scikit-learn + networkx."""
    from sklearn.cluster import HDBSCAN, KMeans

    scores, all_labels = [], []
    for x in embeddings:
        m = len(x)
        if method == "kmeans":
            k = kmeans_k(m, len(np.unique(x, axis=0)))
            labels = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x).labels_
        else:
            mcs, ms = hdbscan_params(m)
            labels = HDBSCAN(min_cluster_size=mcs, min_samples=ms, copy=True).fit(x).labels_
        scores.append(structure_reward(reasoning_map(labels)))
        all_labels.append(labels)
    return scores, all_labels


def inertia(x: np.ndarray, labels: np.ndarray) -> float:
    """KMeans objective: within-cluster sum of squared distances (noise, label -1, as one cluster)."""
    return float(sum(((x[labels == c] - x[labels == c].mean(0)) ** 2).sum() for c in np.unique(labels)))


def bench_structure(cfg: DictConfig, console: Console) -> list[dict]:
    embs = synthetic_batch(cfg.n_responses, cfg.steps, cfg.dim, cfg.functions, cfg.noise, cfg.seed)
    n_steps = sum(len(e) for e in embs)
    console.print(
        f"structure stage: {len(embs)} responses, {n_steps / len(embs):.1f} steps each on average, dim {cfg.dim}"
    )
    rows = []
    for method in cfg.methods:
        t0 = time.perf_counter()
        labels = cluster_batch(embs, method=method, seed=cfg.seed)
        t1 = time.perf_counter()
        metrics = graph_metrics_batch(labels)
        fast = metrics.rewards("sarl")
        t2 = time.perf_counter()
        subset = embs if cfg.naive_limit is None else embs[: cfg.naive_limit]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t3 = time.perf_counter()
            slow, slow_labels = naive_rewards(subset, method, cfg.seed)
            slow = np.array(slow)
            naive_s = (time.perf_counter() - t3) * len(embs) / len(subset)
        fast_s = t2 - t0
        rows.append(
            {
                "method": method,
                "cluster_s": t1 - t0,
                "graph_s": t2 - t1,
                "batched_s": fast_s,
                "naive_s": naive_s,
                "speedup": naive_s / fast_s,
                "naive_extrapolated": len(subset) < len(embs),
                "mean_sr_batched": float(fast.mean()),
                "mean_sr_naive": float(slow.mean()),
                "same_sr_fraction": float(np.mean(np.isclose(fast[: len(subset)], slow))),
                # KMeans seeds differ from scikit-learn's, so labels may differ; the objective must not be worse.
                "inertia_ratio": float(
                    np.mean([inertia(x, a) / inertia(x, b) for x, a, b in zip(subset, labels, slow_labels)])
                ),
            }
        )
    return rows


def bench_embedding(cfg: DictConfig, console: Console) -> dict | None:
    from sarl.embed.http import HTTPEmbedder
    from sarl.embed.local import SentenceTransformerEmbedder, bundled_minilm_path
    from sarl.embed.server import VLLM_CPU_ENV, EmbeddingServer

    python = Path(cfg.embedding.server_python)
    if not python.exists():
        console.print(f"[yellow]embedding benchmark skipped: {python} not found (run scripts/setup_vllm_cpu.sh)")
        return None
    rng = np.random.default_rng(cfg.seed)
    words = "let the sum of x y be equal to then we check that it is prime so answer verify compute".split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(8, 40)))) + f" #{i}" for i in range(cfg.embedding.texts)]
    local = SentenceTransformerEmbedder()
    local.embed(texts[:16])  # warm-up
    t0 = time.perf_counter()
    ref = local.embed(texts).vectors
    local_s = time.perf_counter() - t0
    with EmbeddingServer(
        bundled_minilm_path(),
        served_name="minilm",
        python=str(python),
        env=VLLM_CPU_ENV,
        extra_args=list(cfg.embedding.server_args),
        startup_timeout_s=cfg.embedding.startup_timeout_s,
    ) as server:
        with HTTPEmbedder(
            url=server.url,
            model="minilm",
            batch_size=cfg.embedding.batch_size,
            max_concurrency=cfg.embedding.max_concurrency,
            timeout_s=cfg.embedding.timeout_s,
        ) as client:
            client.embed(texts[:16])
            t0 = time.perf_counter()
            got = client.embed(texts)
            http_s = time.perf_counter() - t0
    cos = (got.vectors * ref).sum(1)
    return {
        "texts": len(texts),
        "in_process_s": local_s,
        "http_s": http_s,
        "in_process_texts_per_s": len(texts) / local_s,
        "http_texts_per_s": len(texts) / http_s,
        "http_over_in_process": http_s / local_s,
        "failed": len(got.failed),
        "min_cosine": float(np.nanmin(cos)),
    }


@hydra.main(version_base="1.3", config_path="../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    console = Console(width=160)
    results: dict = {"config": OmegaConf.to_container(cfg), "structure": bench_structure(cfg, console)}
    table = Table(title="clustering + graph stage (SR for every response)")
    for col in (
        "method",
        "cluster s",
        "graph s",
        "batched s",
        "naive loop s",
        "speed-up",
        "mean SR batched / naive",
        "same SR",
        "inertia batched / naive",
    ):
        table.add_column(col, justify="right")
    for r in results["structure"]:
        table.add_row(
            r["method"],
            f"{r['cluster_s']:.2f}",
            f"{r['graph_s']:.2f}",
            f"{r['batched_s']:.2f}",
            f"{r['naive_s']:.2f}{' (extrap.)' if r['naive_extrapolated'] else ''}",
            f"{r['speedup']:.1f}x",
            f"{r['mean_sr_batched']:.4f} / {r['mean_sr_naive']:.4f}",
            f"{100 * r['same_sr_fraction']:.1f}%",
            f"{r['inertia_ratio']:.4f}",
        )
    console.print(table)
    if cfg.embedding.enabled:
        emb = bench_embedding(cfg, console)
        results["embedding"] = emb
        if emb:
            t = Table(title=f"embedding {emb['texts']} texts with all-MiniLM-L6-v2 on CPU")
            for col in ("path", "seconds", "texts/s"):
                t.add_column(col, justify="right")
            t.add_row(
                "in-process (sentence-transformers)",
                f"{emb['in_process_s']:.2f}",
                f"{emb['in_process_texts_per_s']:.0f}",
            )
            t.add_row("HTTP (vLLM CPU server)", f"{emb['http_s']:.2f}", f"{emb['http_texts_per_s']:.0f}")
            console.print(t)
            console.print(
                f"HTTP / in-process time: {emb['http_over_in_process']:.2f}; "
                f"min cosine to in-process vectors {emb['min_cosine']:.4f}; failed {emb['failed']}"
            )
    out = Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir) / "bench.json"
    out.write_text(json.dumps(results, indent=2))
    console.print(f"results in {out}")


if __name__ == "__main__":
    main()
