"""CONTRIBUTING.md's "Add a reward" holds: a toy reward written as its four steps say, in a temporary copy of the
registry (`conf/` and a `baselines/` folder on the package's path), composes into the smoke row, passes the reward
contract and its own test, the row's dry run names it, and `python -m sarl.score` scores a file with it. Nothing else
had to be touched: the four files are all this test writes."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from test_docs_links import README_MAX_LINES
from testkit import run_python

ROOT = Path(__file__).resolve().parents[1]

TOY = {
    "baselines/toy_brevity.py": '''"""A toy reward: shorter responses score higher (CONTRIBUTING.md's example)."""

from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch


class ToyBrevity(RewardFunction):
    diagnostic_keys = ("words",)

    def __init__(self, scale: float = 100.0) -> None:
        super().__init__()
        self.scale = scale

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        out = []
        for text in batch.responses:
            words = len(text.split())
            if words == 0:
                out.append(RewardOutput(0.0, failed="empty response"))
            else:
                out.append(RewardOutput(1.0 - min(words / self.scale, 1.0), {"words": float(words)}))
        return out
''',
    "conf/reward/toy_brevity.yaml": """# A toy reward: 1 - words/scale, floored at 0 (CONTRIBUTING.md's example).
_target_: baselines.toy_brevity.ToyBrevity
scale: 100.0  # words at which the score reaches 0
""",
    "tests/baselines/test_toy_brevity.py": """from baselines.toy_brevity import ToyBrevity
from sarl.contract.reward import RolloutBatch


def test_scores_on_worked_values():
    out = ToyBrevity(scale=10)(RolloutBatch.from_responses(["a b", "a b c d e f g h i j k", ""]))
    assert [o.score for o in out] == [0.8, 0.0, 0.0]
    assert out[2].failed == "empty response" and out[0].diagnostics == {"words": 2.0}
""",
    "docs/methods/toy_brevity.md": """# Toy brevity

`python -m sarl.train +exp=smoke reward=toy_brevity`. r = 1 - min(words / scale, 1) (`ToyBrevity.score`);
an empty response fails. No results: an example.
""",
}


def test_contributing_counts_the_files_this_test_writes():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Add a reward") : text.index("## Add a paper row")]
    (count,) = re.findall(r"\*\*(\d+) files\*\*", section)
    steps = re.findall(r"^\d\. \*\*`([^`]+)`\*\*", section, re.M)
    assert int(count) == len(steps) == len(TOY) <= 4
    assert [s.replace("<name>", "toy_brevity") for s in steps] == list(TOY)


@pytest.fixture
def registry_copy(tmp_path, monkeypatch):
    """conf/ copied to tmp_path, a baselines/ folder there on the `baselines` package's path, the four files
    written into them; compositions read the copy."""
    import baselines
    import sarl.launch.compose as compose

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    for rel, body in TOY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    monkeypatch.setattr(baselines, "__path__", [*baselines.__path__, str(tmp_path / "baselines")])
    monkeypatch.setattr(compose, "CONF_DIR", tmp_path / "conf")
    yield tmp_path


def test_a_toy_reward_added_by_the_four_steps_composes_and_runs(registry_copy, monkeypatch):
    from hydra.utils import instantiate

    from sarl.contract.reward import RolloutBatch, contract_problems, reward_class
    from sarl.launch.compose import compose_train_config
    from sarl.train import main

    cfg, choices = compose_train_config(["+exp=smoke", "reward=toy_brevity"])
    assert choices["reward"] == "toy_brevity" and cfg.reward._target_ == "baselines.toy_brevity.ToyBrevity"
    assert contract_problems(reward_class(cfg.reward._target_)) == []
    reward = instantiate(cfg.reward)
    assert contract_problems(reward) == []
    out = reward(RolloutBatch.from_responses(["<think>a</think> \\boxed{1}", ""]))
    assert out[0].score == pytest.approx(0.98) and reward.failure_counts["empty response"] == 1

    spec = importlib.util.spec_from_file_location(
        "test_toy_brevity", registry_copy / next(k for k in TOY if "tests/" in k)
    )
    toy_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy_test)
    toy_test.test_scores_on_worked_values()  # the reward's own test passes

    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["+exp=smoke", "reward=toy_brevity", "train.dry_run=true", f"run_dir={registry_copy / 'run'}"])
    assert code == 0 and "baselines.toy_brevity.ToyBrevity" in stdout.getvalue()


# `python -m sarl.score` in a child process that sees the registry copy: its `baselines/` folder on the package's
# path (the first argument) and its `conf/` as the primary config directory (`--config-path`).
SCORE_WITH_COPY = """import sys
import baselines
baselines.__path__.append(sys.argv.pop(1))
from sarl.score import main
main()
"""


def test_sarl_score_scores_a_file_with_the_toy_reward(registry_copy):
    src = registry_copy / "responses.jsonl"
    src.write_text('{"id": "short", "response": "a b"}\n{"id": "empty", "response": ""}\n')
    out = registry_copy / "scores.jsonl"
    proc = run_python(
        "-c",
        SCORE_WITH_COPY,
        registry_copy / "baselines",
        f"--config-path={registry_copy / 'conf'}",
        f"input={src}",
        "reward=toy_brevity",
        f"output={out}",
        f"hydra.run.dir={registry_copy / 'score'}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    short, empty = (json.loads(line) for line in out.read_text().splitlines())
    assert short == {"id": "short", "score": pytest.approx(0.98), "words": 2.0, "failed": None}
    assert empty == {"id": "empty", "score": 0.0, "words": None, "failed": "empty response"}
    assert "ToyBrevity" in proc.stdout


# CONTRIBUTING.md's "Add a paper row": a toy row by its two steps, then the generator.
TOY_ROW = {
    "conf/exp/toy_row.yaml": """# @package _global_
# A toy row (CONTRIBUTING.md's example): "Toy Table 1", made up for the test; the smoke run with the ground-truth
# reward and groups of 4. Not a paper's: nothing here is.
defaults:
  - override /model: tiny_qwen3
  - override /algorithm: grpo
  - override /reward: ground_truth
  - override /data: smoke
  - override /backend: trl

train:
  rollout_n: 4                # Toy Table 1's group size

paper:
  tables:
    - {table: Toy Table 1, position: 1, group: "", label: "w/ toy"}
  readme: {data: smoke (shipped), reward: ground_truth, algorithm: GRPO on TRL}
""",
    "tests/sarl/test_method_rows.py": """from sarl.launch.compose import compose_train_config


def test_toy_row_has_its_papers_group_size():
    cfg, _ = compose_train_config(["+exp=toy_row"])
    assert cfg.train.rollout_n == 4 and cfg.reward._target_ == "baselines.ground_truth.GroundTruthReward"
""",
}


def recipe_steps(section: str) -> tuple[int, list[str]]:
    """The file count CONTRIBUTING.md's `## <section>` states and the files its numbered steps name."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    start = text.index(f"## {section}")
    body = text[start : text.find("\n## ", start + 1)]
    (count,) = re.findall(r"\*\*(\d+) files\*\*", body)
    return int(count), re.findall(r"^\d\. \*\*`([^`]+)`\*\*", body, re.M)


def run_test_file(path: Path, *args) -> None:
    """Every `test_*` function of the file at `path`, called with `args`."""
    spec = importlib.util.spec_from_file_location(path.stem + "_toy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [f for name, f in vars(module).items() if name.startswith("test_") and callable(f)]
    assert tests, path
    for test in tests:
        test(*args)


def test_contributing_names_the_files_of_a_row_and_of_a_benchmark_this_test_writes():
    count, steps = recipe_steps("Add a paper row")
    assert count == len(steps) == len(TOY_ROW) and [s.replace("<row>", "toy_row") for s in steps] == list(TOY_ROW)
    count, steps = recipe_steps("Add an evaluation benchmark")
    assert count == len(steps) == len(TOY_BENCH) and [s.replace("<name>", "toy_bench") for s in steps] == list(
        TOY_BENCH
    )


def test_a_toy_row_added_by_its_two_steps_composes_and_the_generator_lists_it(tmp_path, monkeypatch):
    import sarl.launch.compose as compose
    from sarl.reports import rows_doc
    from sarl.runtime.rows import metadata_problems

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "docs").mkdir()
    for rel in ("README.md", "docs/reproduce.md"):
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert rows_doc.stale(tmp_path) == []
    for rel, body in TOY_ROW.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    monkeypatch.setattr(compose, "CONF_DIR", tmp_path / "conf")
    run_test_file(tmp_path / "tests/sarl/test_method_rows.py")  # it composes, and its own test passes
    assert metadata_problems(tmp_path / "conf" / "exp") == []

    stale = rows_doc.stale(tmp_path)  # the check names the line each document lacks
    assert [s.split(":")[0] for s in stale] == ["README.md", "reproduce.md"] and all("toy_row" in s for s in stale)
    assert rows_doc.write_docs(tmp_path) == [tmp_path / "README.md", tmp_path / "docs" / "reproduce.md"]
    readme, reproduce = (tmp_path / "README.md").read_text(), (tmp_path / "docs" / "reproduce.md").read_text()
    assert '| `toy_row` | Toy Table 1 "w/ toy" | smoke (shipped) | ground_truth | GRPO on TRL |' in readme.splitlines()
    assert "| Toy Table 1 | 1 |  | w/ toy | `+exp=toy_row` |" in reproduce.splitlines()
    assert rows_doc.stale(tmp_path) == []
    assert len(readme.splitlines()) <= README_MAX_LINES  # a new row's line still fits the front page


# CONTRIBUTING.md's "Add an evaluation benchmark": a toy math benchmark by its three steps.
TOY_BENCH = {
    "conf/data/toy_bench.yaml": """# A toy math benchmark (CONTRIBUTING.md's example), 3 problems. Evaluation only.
name: toy_bench
role: eval
setting: math
builder: math
split: test
source:
  hf_id: null
  hf_config: null
  revision: null
  split: test
  local_file: null            # the fixture, given on the command line
fields:
  id: id
  question: question
  answer: answer
  extra: {}
prompt_suffix: " Let's think step by step and output the final answer within \\\\boxed{}."
answers: {several: null, remark: null, fixes: {}}
expected_count: 3
""",
    "tests/fixtures/data/toy_bench.jsonl": "".join(
        json.dumps({"id": f"toy-{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
        for i in (1, 2, 3)
    ),
    "tests/sarl/test_data_prepare.py": """import pyarrow.parquet as pq

from sarl.data.prepare import compose_prepare_config, prepare


def test_toy_bench(root):  # the case test_math_evaluation_sets holds for it: count, first id, gold answer
    fixture = root / "tests" / "fixtures" / "data" / "toy_bench.jsonl"
    prepare(compose_prepare_config(["dataset=toy_bench", f"paths.root={root}", f"source.local_file={fixture}"]))
    rows = pq.read_table(root / "data" / "toy_bench" / "test.parquet").to_pylist()
    assert len(rows) == 3 and rows[0]["extra_info"]["id"] == "toy-1"
    assert rows[0]["reward_model"]["ground_truth"] == ["2"]
""",
}


def test_a_toy_benchmark_added_by_its_three_steps_is_prepared_and_planned(tmp_path, monkeypatch):
    import eval.config
    import eval.prompts
    import eval.protocol
    import sarl.data.prepare
    from eval.config import compose_eval_config
    from eval.protocol import check_runnable, format_plan, resolve_plan

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    for rel, body in TOY_BENCH.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    conf = tmp_path / "conf"
    for module, name, value in (
        (sarl.data.prepare, "CONF_DIR", conf),
        (eval.config, "CONF_DIR", conf),
        (eval.protocol, "DATA_CONF", conf / "data"),
        (eval.prompts, "DATA_CONF_DIR", conf / "data"),
    ):
        monkeypatch.setattr(module, name, value)
    from hydra.core.config_store import ConfigStore

    datasets = ConfigStore.instance().repo["dataset"]
    monkeypatch.setattr(ConfigStore.instance(), "repo", {**ConfigStore.instance().repo, "dataset": dict(datasets)})
    sarl.data.prepare.register_datasets()  # as importing sarl.data.prepare does: every conf/data file, the toy's too
    run_test_file(tmp_path / "tests/sarl/test_data_prepare.py", tmp_path)  # prepared from the fixture

    cfg = compose_eval_config(
        ["ckpt=unused", f"paths.root={tmp_path}", "benchmarks.math=[toy_bench]", "benchmarks.wildbench=[]"]
    )
    plan = resolve_plan(cfg)
    assert [e.name for e in plan.entries] == ["toy_bench"]
    check_runnable(plan, cfg.paths.data_dir)  # its data is where eval.run reads it
    assert plan.entries[0].prompt.source == "as prepared: conf/data/toy_bench.yaml"  # asked with its prompt_suffix
    assert "toy_bench" in format_plan(plan, cfg.paths.data_dir)  # the line eval.run's dry run prints for it


def hash_embedder():
    """A stand-in embedder (`sarl.structure.embed.base.Embedder`): each step a vector seeded by its text."""
    import numpy as np

    from sarl.structure.embed.base import Embedder

    class HashEmbedder(Embedder):
        def _embed_unique(self, texts):
            return [np.random.default_rng(sum(t.encode())).standard_normal(8) for t in texts], {}

    return HashEmbedder(dim=8)


# CONTRIBUTING.md's "Add a clustering method", performed: a toy method ("halves": the first half of a response's
# steps one cluster, the rest another) registered as its steps 1-2 say, its step-3 test, and a SARL row composed with
# it (step 4: `reward.clustering=<name>`) scoring a batch; every shipped method is in each file the recipe names.
def test_a_toy_clustering_method_added_by_the_recipe_s_steps_clusters_a_row_s_responses(monkeypatch):
    import numpy as np
    import yaml
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from sarl.contract.reward import RolloutBatch
    from sarl.launch.compose import compose_train_config
    from sarl.structure import cluster, reference
    from sarl.structure.reward import StructureReward

    count, steps = recipe_steps("Add a clustering method")
    assert count == len(steps) == 4
    assert steps[:2] == ["sarl/structure/cluster.py", "sarl/structure/reference.py"]
    for rel in steps:
        text = (ROOT / rel).read_text()
        for method in cluster.LABELERS:
            assert re.search(rf"\b{method}\b", text), f"{rel} does not name the clustering method {method}"
    with pytest.raises(ValueError, match="clustering method 'halves' not found; choose one of: kmeans, hdbscan"):
        StructureReward(embedder=None, clustering="halves")

    def halves_response(x, i, shared):  # step 1: its labels for one response, registered by name
        return (np.arange(len(x)) >= len(x) / 2).astype(np.int64)

    def halves_reference(x, seed, k_rule, max_iter, gram):  # step 2: the plain version
        return np.array([0 if j < len(x) / 2 else 1 for j in range(len(x))], dtype=np.int64)

    monkeypatch.setitem(cluster.LABELERS, "halves", halves_response)
    monkeypatch.setitem(reference.REFERENCE, "halves", halves_reference)
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 8):  # step 3: the compiled labels equal the reference's
        x = rng.standard_normal((m, 4))
        assert (cluster.cluster_steps(x, "halves") == reference.cluster_steps(x, "halves")).all()

    cfg, _ = compose_train_config(["+exp=smoke", "reward.clustering=halves"])  # step 4
    reward_cfg = OmegaConf.to_container(cfg.reward, resolve=True)
    reward_cfg["embedder"] = hash_embedder()  # no model here: each step's own seeded vector
    reward = instantiate(reward_cfg, _convert_="all")
    assert reward.clustering == "halves"
    response = "<think>We add.\n\nWe carry.\n\nWe check.\n\nWe answer.</think> \\boxed{4}"
    out = reward(RolloutBatch.from_responses([response, response]))
    assert [o.failed for o in out] == [None, None] and out[0].score == out[1].score
    assert out[0].diagnostics["n_nodes"] == 2 and out[0].diagnostics["n_steps"] == 4  # two clusters: the halves

    bench = yaml.safe_load((ROOT / "conf" / "bench.yaml").read_text())
    assert set(bench["structure"]["methods"]) <= set(cluster.LABELERS)  # what the bench times
