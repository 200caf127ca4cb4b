"""Reasoning-map pictures in the style of SARL Fig. 2b: nodes are reasoning functions
(step clusters), edges are transitions between consecutive steps."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np

from sarl.contract.reward import RolloutBatch
from sarl.structure.graph import reasoning_map


def plot_reasoning_map(
    steps: Sequence[str],
    labels: Sequence[int],
    path: str | Path,
    title: str = "",
    snippet_chars: int = 48,
) -> Path:
    """Draw one response's reasoning map to `path` (PNG) and return the path.

    Node size grows with the number of steps in the cluster; each node is labelled with
    its cluster id, its step count and the start of its first step.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    labels = [int(x) for x in labels]
    G = reasoning_map(labels)
    counts = {v: labels.count(v) for v in G.nodes}
    first_step = {v: steps[labels.index(v)] for v in G.nodes}
    fig, ax = plt.subplots(figsize=(8, 6))
    if G.number_of_nodes():
        pos = nx.spring_layout(G, seed=0) if G.number_of_nodes() > 2 else nx.circular_layout(G)
        sizes = [600 + 300 * counts[v] for v in G.nodes]
        nx.draw_networkx_edges(G, pos, ax=ax, width=2.0, edge_color="#888888")
        nx.draw_networkx_nodes(G, pos, ax=ax, node_size=sizes, node_color="#8fb9e6", edgecolors="#1f4e79")
        names = {v: f"F{i + 1}\n{counts[v]} step{'s' if counts[v] != 1 else ''}" for i, v in enumerate(G.nodes)}
        nx.draw_networkx_labels(G, pos, names, ax=ax, font_size=8)
        for i, v in enumerate(G.nodes):
            x, y = pos[v]
            snippet = textwrap.shorten(first_step[v].replace("\n", " "), snippet_chars, placeholder="…")
            ax.annotate(
                snippet, (x, y), xytext=(0, -34), textcoords="offset points", ha="center", fontsize=6, color="#333333"
            )
        xs = np.array([p[0] for p in pos.values()])
        ys = np.array([p[1] for p in pos.values()])
        ax.set_xlim(xs.min() - 0.5, xs.max() + 0.5)
        ax.set_ylim(ys.min() - 0.5, ys.max() + 0.5)
    else:
        ax.text(0.5, 0.5, "no reasoning steps", ha="center", va="center")
    ax.set_title(title, fontsize=10)
    ax.axis("off")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def view_response(
    response: str,
    reward,
    path: str | Path,
    title: str | None = None,
    prompt: str = "",
):
    """The reasoning-map viewer for one response: score it with `reward` (a StructureReward), draw its map to
    `path` (PNG) and return (path, analysis). The title defaults to its SR, C, L and step count. A response whose
    reward could not be computed raises ValueError with the reason; one without steps draws an empty map."""
    analysis = reward.analyze(RolloutBatch.from_columns(responses=[response], prompts=[prompt]))[0]
    if analysis.output.failed:
        raise ValueError(f"the structure reward of this response could not be computed: {analysis.output.failed}")
    d = analysis.output.diagnostics
    if title is None:
        title = (
            "  ".join(
                f"{name}={d[key]:.3f}" if isinstance(d.get(key), float) else f"{name}=-"
                for name, key in (("SR", "sr"), ("C", "C"), ("L", "L"))
            )
            + f"  steps={int(d.get('n_steps', 0))}"
        )
    labels = analysis.labels if analysis.labels is not None else []
    return plot_reasoning_map(analysis.steps, labels, path, title=title), analysis


def step_table(analysis) -> list[tuple[int, str, str]]:
    """(step number, reasoning function F<i> as in the map, first line of the step) for each step."""
    if analysis.labels is None:
        return []
    order = {v: i for i, v in enumerate(dict.fromkeys(int(x) for x in analysis.labels))}
    return [
        (n + 1, f"F{order[int(lab)] + 1}", textwrap.shorten(step.replace("\n", " "), 100, placeholder="…"))
        for n, (step, lab) in enumerate(zip(analysis.steps, analysis.labels))
    ]
