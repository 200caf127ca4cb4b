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
# # docs/fidelity.md: each paper row's settings, where its paper gives them, and its deviations
#
# Composes every paper row (`conf/exp/*_paper.yaml`, and every other row naming a paper table: SARL's own) with Hydra
# (as `sarl.train` does) and reads its `paper.fidelity` block, with the shared settings of `conf/fidelity/` it takes
# (`notebooks/_fidelity.py` says what the block holds); writes the page and lists what is missing from a block.
#
#     python notebooks/fidelity.py --out docs/fidelity.md

# %%
import sys
from pathlib import Path

sys.path.insert(0, str(Path("notebooks").resolve()) if Path("notebooks/_paper.py").exists() else ".")
import _fidelity as fidelity  # noqa: E402
import _paper as paper  # noqa: E402

SETTINGS = paper.settings(
    "docs/fidelity.md from the paper rows' configs and their paper.fidelity blocks.",
    out=(str(fidelity.DOC), "the page written"),
)

# %% [markdown]
# ## The rows' blocks checked: a location for each setting, the paper's value and a reason for each deviation

# %%
found = fidelity.problems()
print("\n".join(found) or "every paper row's block is complete")

# %% [markdown]
# ## The page

# %%
Path(SETTINGS["out"]).write_text(fidelity.render(), encoding="utf-8")
print(f"wrote {SETTINGS['out']}")
if found:
    raise SystemExit(1)
