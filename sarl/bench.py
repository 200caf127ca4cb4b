"""Benchmarks of the structure reward's hot path, measured in one run.

    python -m sarl.bench                  # suite=structure: 1 and 2
    python -m sarl.bench suite=maxflow    # 3

1. Clustering + graph stage: `structure_rewards_from_embeddings` on a realistic batch
   against the naive per-response loop (scikit-learn KMeans / HDBSCAN + networkx).
2. Embedding client: HTTPEmbedder against a local vLLM server versus the same model
   called in-process (the HTTP overhead).
3. MaxFlow step importance (Structured Reasoning Sec. 4.3 (b), App. F): F and every F_{-k} with
   `baselines.maxflow.step_importance` (Dinic + residual reuse) against networkx's max flow
   (one call for F, one per removed node, as the paper's baseline), on identical random
   capacity graphs; the values must agree.
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


def attention_like_capacity(n: int, rng: np.random.Generator, tau: float) -> np.ndarray:
    """A capacity graph shaped like thresholded step attention (Structured Reasoning Eq. 3, Sec. 4.3 (a)): each node's
    attention over the earlier nodes sums to at most 1, with extra mass on the question (node 0, where
    attention sinks) and on the step just before (locality)."""
    from baselines.maxflow import capacity_graph

    att = np.zeros((n, n))
    for i in range(1, n):
        w = rng.dirichlet(np.full(i, 0.5))
        w[0] += rng.uniform(0.5, 2.0)
        w[i - 1] += rng.uniform(0.5, 2.0)
        att[i, :i] = w / w.sum() * rng.uniform(0.6, 1.0)
    return capacity_graph(att, tau)


def dense_capacity(n: int, rng: np.random.Generator) -> np.ndarray:
    """The paper's scaling test graphs (Structured Reasoning Table 21): every earlier -> later pair, capacity U(0, 1)."""
    return np.triu(rng.uniform(0.0, 1.0, (n, n)), 1)


def networkx_importance(cap: np.ndarray) -> tuple[float, np.ndarray]:
    """F and F - F_{-k} with networkx: one max flow for G, one per removed intermediate node."""
    import networkx as nx

    n = len(cap)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for u, v in zip(*np.nonzero(cap)):
        g.add_edge(int(u), int(v), capacity=float(cap[u, v]))
    flow = nx.maximum_flow_value(g, 0, n - 1)
    delta = np.zeros(n)
    for k in range(1, n - 1):
        h = g.copy()
        h.remove_node(k)
        delta[k] = flow - nx.maximum_flow_value(h, 0, n - 1)
    return flow, delta


def bench_maxflow(cfg: DictConfig, console: Console) -> list[dict]:
    from baselines.maxflow import step_importance

    if len(cfg.sizes) != len(cfg.graphs):
        raise ValueError(f"maxflow.sizes {list(cfg.sizes)} and maxflow.graphs {list(cfg.graphs)} differ in length")
    rng = np.random.default_rng(cfg.seed)
    rows = []
    for family in cfg.families:
        for n, count in zip(cfg.sizes, cfg.graphs):
            if family == "attention":
                caps = [attention_like_capacity(n, rng, cfg.tau) for _ in range(count)]
            elif family == "dense":
                caps = [dense_capacity(n, rng) for _ in range(count)]
            else:
                raise ValueError(f"maxflow family {family!r} is not valid; choose attention or dense")
            t0 = time.perf_counter()
            ours = [step_importance(c) for c in caps]
            ours_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            ref = [networkx_importance(c) for c in caps]
            nx_s = time.perf_counter() - t0
            diff = max(max(abs(a[0] - b[0]), float(np.abs(a[1] - b[1]).max())) for a, b in zip(ours, ref))
            if diff > cfg.tolerance:
                raise AssertionError(f"max flow differs from networkx by {diff:.3g} ({family}, n={n})")
            rows.append(
                {
                    "family": family,
                    "nodes": n,
                    "graphs": count,
                    "edges_mean": float(np.mean([(c > 0).sum() for c in caps])),
                    "ours_s": ours_s,
                    "networkx_s": nx_s,
                    "speedup": nx_s / ours_s,
                    "max_abs_diff": diff,
                }
            )
            console.print(f"maxflow {family} n={n}: ours {ours_s:.3f}s, networkx {nx_s:.3f}s")
    return rows


def _run_maxflow(cfg: DictConfig, console: Console) -> dict:
    rows = bench_maxflow(cfg.maxflow, console)
    table = Table(title="MaxFlow step importance: F and every F_{-k} (values identical to networkx)")
    for col in ("family", "nodes", "graphs", "edges", "ours s", "networkx s", "speed-up", "max |diff|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["family"],
            str(r["nodes"]),
            str(r["graphs"]),
            f"{r['edges_mean']:.0f}",
            f"{r['ours_s']:.3f}",
            f"{r['networkx_s']:.3f}",
            f"{r['speedup']:.1f}x",
            f"{r['max_abs_diff']:.1e}",
        )
    console.print(table)
    for family in cfg.maxflow.families:
        ours = sum(r["ours_s"] for r in rows if r["family"] == family)
        ref = sum(r["networkx_s"] for r in rows if r["family"] == family)
        console.print(f"{family}: all sizes {ours:.2f}s vs networkx {ref:.2f}s: {ref / ours:.1f}x")
    return {"config": OmegaConf.to_container(cfg), "maxflow": rows}


@hydra.main(version_base="1.3", config_path="../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    console = Console(width=160)
    if cfg.suite == "maxflow":
        results = _run_maxflow(cfg, console)
    elif cfg.suite == "structure":
        results = _run_structure(cfg, console)
    else:
        raise ValueError(f"suite={cfg.suite!r} is not valid; choose structure or maxflow")
    out = Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir) / "bench.json"
    out.write_text(json.dumps(results, indent=2))
    console.print(f"results in {out}")


def _run_structure(cfg: DictConfig, console: Console) -> dict:
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
    return results


if __name__ == "__main__":
    main()
