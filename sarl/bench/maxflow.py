"""MaxFlow step importance (Structured Reasoning Sec. 4.3 (b), App. F): F and every F_{-k} with
`baselines.maxflow.flow.step_importance` (Dinic + residual reuse) against networkx's max flow (one call for F,
one per removed node, as the paper's baseline), on identical random capacity graphs; the values must agree.
"""

from __future__ import annotations

import time

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from baselines.maxflow.flow import capacity_graph, step_importance


def attention_like_capacity(n: int, rng: np.random.Generator, tau: float) -> np.ndarray:
    """A capacity graph shaped like thresholded step attention (Structured Reasoning Eq. 3, Sec. 4.3 (a)): each node's
    attention over the earlier nodes sums to at most 1, with extra mass on the question (node 0, where
    attention sinks) and on the step just before (locality)."""
    att = np.zeros((n, n))
    for i in range(1, n):
        w = rng.dirichlet(np.full(i, 0.5))
        w[0] += rng.uniform(0.5, 2.0)
        w[i - 1] += rng.uniform(0.5, 2.0)
        att[i, :i] = w / w.sum() * rng.uniform(0.6, 1.0)
    return capacity_graph(att, tau)


def dense_capacity(n: int, rng: np.random.Generator) -> np.ndarray:
    """The scaling test graphs (Structured Reasoning Table 21): every earlier -> later pair, capacity U(0, 1)."""
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


def run_maxflow(cfg: DictConfig, console: Console) -> list[dict]:
    rows = bench_maxflow(cfg, console)
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
    for family in cfg.families:
        ours = sum(r["ours_s"] for r in rows if r["family"] == family)
        ref = sum(r["networkx_s"] for r in rows if r["family"] == family)
        console.print(f"{family}: all sizes {ours:.2f}s vs networkx {ref:.2f}s: {ref / ours:.1f}x")
    return rows
