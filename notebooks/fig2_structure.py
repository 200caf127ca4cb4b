# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # SARL Fig. 2: structure reward before and after training (2a) and a reasoning map before and after (2b)
#
# Fig. 2a reads the mean structure reward per benchmark from the `results.json` of the base model and of the trained
# rows (`eval.run` computes it for every sampled response): `RESULTS/base/` and `RESULTS/<exp>/` as in `tables.py`.
# Fig. 2b scores two responses to the same problem (a JSONL file with `label` and `response`, first line before
# training, second after) with the structure reward and draws their reasoning maps with the viewer
# `sarl.structure.viz.view_response` (the same one as `python -m sarl.score input=FILE view=ID`).
#
#     python notebooks/fig2_structure.py --results runs/eval --responses pair.jsonl --out runs/paper

# %%
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path("notebooks").resolve()) if Path("notebooks/_paper.py").exists() else ".")
import _paper as paper  # noqa: E402

from sarl.reports import figures  # noqa: E402

SETTINGS = paper.settings(
    "SARL Fig. 2: the structure reward before and after training (2a) and two reasoning maps (2b).",
    results=("runs/eval", "eval.run's results: a folder per row"),
    responses=("", "a JSONL of two responses (label, response) for Fig. 2b: before, then after training"),
    out=("runs/paper", "where the figures are written"),
    trained_math=("grpo_sarl_math", "the row compared with the base model on the math benchmarks"),
    trained_open=("grpo_sarl_open", "the row compared on WildBench"),
    embedder=("local", "Fig. 2b's step embeddings: local (MiniLM) or vllm_server"),
    embed_url=("", "the embedding server's URL (embedder vllm_server)"),
    embed_model=("Qwen/Qwen3-Embedding-0.6B", "the embedding server's model (embedder vllm_server)"),
)
RESULTS, RESPONSES, OUT = SETTINGS["results"], SETTINGS["responses"], Path(SETTINGS["out"])
TRAINED_MATH, TRAINED_OPEN = SETTINGS["trained_math"], SETTINGS["trained_open"]
OUT.mkdir(parents=True, exist_ok=True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# %% [markdown]
# ## Fig. 2a: mean structure reward per benchmark, base vs. trained, with the relative change

# %%
results = paper.load_results(RESULTS, ["base", TRAINED_MATH, TRAINED_OPEN])
bench = [(k, name, TRAINED_MATH) for k, name in paper.MATH_BENCHMARKS] + [(paper.WILDBENCH, "WildBench", TRAINED_OPEN)]


def sr_of(row, key):
    r = results.get(row) or {}
    part = (r.get("math") or {}) if key != paper.WILDBENCH else (r.get("wildbench") or {})
    return (((part.get("benchmarks") or {}).get(key) or {}).get("structure") or {}).get("sr_mean")


fig2a = {}
skipped = []
for key, name, row in bench:
    before, after = sr_of("base", key), sr_of(row, key)
    if before is None or after is None:
        skipped.append(f"{name} ({'base' if before is None else row} has no structure statistics)")
        continue
    fig2a[name] = {"base": before, "trained": after, "row": row, "change_pct": figures.change_pct(before, after)}
if skipped:
    print("left out of Fig. 2a:", "; ".join(skipped))
if not fig2a:
    raise SystemExit(f"no benchmark has structure statistics for both the base model and the trained rows in {RESULTS}")

figures.plot_structure_bars(fig2a, OUT / "fig2a_structure_reward.png")
(OUT / "fig2a.json").write_text(json.dumps({"benchmarks": fig2a, "left_out": skipped}, indent=2), encoding="utf-8")
print(json.dumps(fig2a, indent=1))

# %% [markdown]
# ## Fig. 2b: the reasoning map of one problem's response before and after training
#
# Scored with the structure reward of the math setting (`conf/reward/sarl.yaml`: KMeans, "\n\n" steps) and the
# in-process MiniLM embedder (`bundled-minilm`), unless `SARL_EMBEDDER=vllm_server` and `SARL_EMBED_URL` name a
# `/v1/embeddings` server as in the paper (Qwen3-Embedding-0.6B).

# %%
if RESPONSES:
    from sarl.score import read_responses
    from sarl.structure.reward import StructureReward
    from sarl.structure.viz import step_table, view_response

    pair = read_responses(RESPONSES)
    if len(pair) != 2:
        raise SystemExit(f"{RESPONSES}: Fig. 2b needs exactly two responses (before, after), found {len(pair)}")
    if SETTINGS["embedder"] == "vllm_server":
        from sarl.serving.http import HTTPEmbedder

        embedder = HTTPEmbedder(
            url=SETTINGS["embed_url"],
            model=SETTINGS["embed_model"],
        )
    else:
        from sarl.structure.embed.local import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()
    reward = StructureReward(embedder, variant="sarl", clustering="kmeans")
    panels, fig2b = [], {}
    for side, row in zip(("before", "after"), pair):
        png, analysis = view_response(
            row["response"], reward, OUT / f"fig2b_{side}.png", prompt=str(row.get("prompt", ""))
        )
        d = analysis.output.diagnostics
        label = row.get("label", side)
        fig2b[side] = {
            "label": label,
            "id": row["id"],
            **{k: d.get(k) for k in ("sr", "C", "L", "n_steps", "n_nodes", "n_edges")},
        }
        panels.append((png, f"{label}: SR={d['sr']:.2f}, {int(d['n_nodes'])} functions, {int(d['n_edges'])} edges"))
        print(f"{label}:")
        for n, function, text in step_table(analysis):
            print(f"  {n:3d} {function:4s} {text}")
    fig, axes = plt.subplots(1, 2, figsize=(14, 6))
    for ax, (png, title) in zip(axes, panels):
        ax.imshow(plt.imread(png))
        ax.set_title(title, fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(OUT / "fig2b_reasoning_maps.png", dpi=120)
    (OUT / "fig2b.json").write_text(json.dumps(fig2b, indent=2), encoding="utf-8")
    print(json.dumps(fig2b, indent=1))
else:
    print("Fig. 2b skipped: give --responses FILE.jsonl (two responses: before and after training)")
