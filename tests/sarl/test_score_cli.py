"""`python -m sarl.score` on the shipped samples, on a user file, and with every reward of conf/reward/."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from testkit import REPO, run_module

from baselines.code_exec import sandbox_settings
from sarl.contract.reward import reward_class
from sarl.score import read_responses, reward_calls
from sarl.structure.reward import StructureReward

CONF = REPO / "conf"
REWARDS = sorted(p.stem for p in (CONF / "reward").glob("*.yaml"))
STRUCTURE_COLUMNS = {"SR", "C", "L", "n_steps", "n_nodes", "n_edges", "no_think", "truncated", "steps_capped"}
MAXFLOW = "baselines.maxflow.reward.MaxFlowReward"

# The documented input fields (sarl/score.py): rows "a*" share a "group", rows "b*" only their "prompt" text; the
# gold answers are math answers (one, or a list of accepted ones), or tests for the rewards that run code.
MATH_ROWS = [
    {
        "id": "a1",
        "group": "a",
        "prompt": "What is 1 + 1?",
        "ground_truth": "2",
        "response": "<think><assumption> one is 1.\n<inference> one plus one is two.\n<verify> the sum is 2.</think> "
        "The answer is \\boxed{2}.",
    },
    {
        "id": "a2",
        "group": "a",
        "prompt": "What is 1 + 1?",
        "ground_truth": "2",
        "response": "<think>A guess.\n\nThree.</think> The answer is \\boxed{3}.",
    },
    {
        "id": "b1",
        "prompt": "What is 2 + 2?",
        "ground_truth": ["4", "four"],
        "response": "<think>Two and two.\n\nThat makes four.</think> \\boxed{4}",
        "data_source": "toy",
        "extra_info": {"index": 1},
    },
    {"id": "b2", "prompt": "What is 2 + 2?", "ground_truth": "4", "response": "no thinking and no box"},
]
GRAPH = '<known>\n{"id": 1, "parents_id": [], "content": "add one"}\n</known>'
PROGRAM = "```python\ndef add_one(x):\n    return x + 1\n```"
CODE_ROWS = [
    {
        "id": "c1",
        "group": "add_one",
        "prompt": "Write add_one(x).",
        "ground_truth": {"tests": "assert add_one(1) == 2"},
        "response": f"<think>\n{GRAPH}\n</think>\n<answer>\n{PROGRAM}\n</answer>",
    },
    {
        "id": "c2",
        "group": "add_one",
        "prompt": "Write add_one(x).",
        "ground_truth": {"tests": "assert add_one(1) == 2"},
        "response": "<think>\nhmm\n</think>\n<answer>no code</answer>",
    },
]


def run_cli(tmp_path, *overrides):
    proc = run_module("sarl.score", f"hydra.run.dir={tmp_path}/run", *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_one_line_error(proc, *words):
    """Exit code 2 and one line on stderr naming `words`, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sarl.score: ") and all(w in last for w in words), (words, last)


@pytest.mark.slow
def test_scores_shipped_samples_with_plots(tmp_path):
    out = tmp_path / "out.jsonl"
    proc = run_cli(tmp_path, f"output={out}", "plot=true", f"plot_dir={tmp_path}/maps")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in read_responses(None)]
    for r in rows:
        assert set(r) >= {"id", "score", "failed", *STRUCTURE_COLUMNS}
        assert 0.0 <= r["score"] <= 1.0 and r["failed"] is None
    by_id = {r["id"]: r for r in rows}
    assert by_id["no-think"]["no_think"] and by_id["truncated"]["truncated"]
    assert by_id["aime-loop"]["n_steps"] > 15
    pngs = sorted(p.name for p in (tmp_path / "maps").glob("*.png"))
    assert pngs == sorted(f"{r['id']}.png" for r in rows)
    assert all((tmp_path / "maps" / p).stat().st_size > 5000 for p in pngs)
    assert "Structure reward" in proc.stdout and "mean score" in proc.stdout


@pytest.mark.slow
def test_user_file_with_ablation_and_hdbscan(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({"id": "a", "response": "<think>x\n\ny\n\nz</think>"}) + "\n\n" + json.dumps({"response": ""}) + "\n"
    )
    out = tmp_path / "o.jsonl"
    run_cli(tmp_path, f"input={src}", f"output={out}", "reward=sarl_l_only", "reward.clustering=hdbscan")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "3"]
    assert rows[1]["score"] == 0.0 and rows[1]["n_steps"] == 0


@pytest.fixture(scope="module")
def tiny_policy(byte_tokenizer, tmp_path_factory):
    """A tiny Qwen3 checkpoint (random weights, eager attention): the attention model of the MaxFlow rewards."""
    from testkit import tiny_qwen3

    path = tmp_path_factory.mktemp("tiny_policy")
    architecture = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 32, "attn_implementation": "eager"}
    tiny_qwen3(byte_tokenizer, path, weights=True, seed=0, **architecture)
    return path


def attention_models(node, prefix: str = "reward") -> list[str]:
    """The config paths of the MaxFlow rewards in a reward config (the reward itself or a component of it)."""
    if not isinstance(node, dict):
        return []
    if node.get("_target_") == MAXFLOW:
        return [prefix]
    return [path for key, value in node.items() for path in attention_models(value, f"{prefix}.{key}")]


def reward_config(name: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="score", overrides=[f"reward={name}"]).reward)


@pytest.fixture(scope="module")
def scored(tmp_path_factory, request) -> dict[str, tuple[list[dict], list[dict]]]:
    """{reward: (input rows, output lines)} of `python -m sarl.score` with every conf/reward/*.yaml. The rewards that
    read the same rows with the same settings share one child process (Hydra's multirun, `-m reward=a,b,...`: each
    reward is its own job, in the order given); MaxFlow's attention model is set where the reward has one."""
    batches: dict[tuple, list[str]] = {}
    for name in REWARDS:
        cfg = reward_config(name)
        overrides = []
        for path in attention_models(cfg):
            model = request.getfixturevalue("tiny_policy")
            overrides += [f"{path}.model={model}", f"{path}.layers=[-1]", f"{path}.device=cpu"]
        rows = "code" if sandbox_settings(cfg) else "math"
        batches.setdefault((rows, tuple(overrides)), []).append(name)
    out: dict[str, tuple[list[dict], list[dict]]] = {}
    for i, ((kind, overrides), names) in enumerate(sorted(batches.items())):
        tmp = tmp_path_factory.mktemp(f"score{i}")
        rows = CODE_ROWS if kind == "code" else MATH_ROWS
        src = write_rows(tmp / "in.jsonl", rows)
        sweep = ["-m", f"hydra.sweep.dir={tmp}/sweep", f"input={src}", f"reward={','.join(names)}", *overrides]
        proc = run_module("sarl.score", *sweep)
        assert proc.returncode == 0, (names, proc.stderr[-3000:])
        assert proc.stdout.count("mean score") == len(names), proc.stdout[-3000:]
        for job, name in enumerate(names):
            lines = (tmp / "sweep" / str(job) / "scores.jsonl").read_text().splitlines()
            out[name] = (rows, [json.loads(line) for line in lines])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", REWARDS)
def test_scores_a_file_with_every_reward(name, scored):
    """Every conf/reward/*.yaml through the one reward interface: one line per row, in the input's order, with a
    numeric score or a named failure; the structure columns exactly for the structure rewards. The rewards that
    run code get the code rows, MaxFlow gets a tiny policy's attention."""
    structure = issubclass(reward_class(reward_config(name)["_target_"]), StructureReward)
    rows, lines = scored[name]
    assert [r["id"] for r in lines] == [r["id"] for r in rows]
    for r in lines:
        assert isinstance(r["score"], float), r
        assert r["failed"] is None or (isinstance(r["failed"], str) and r["failed"]), r
        assert (set(r) >= STRUCTURE_COLUMNS) if structure else not set(r) & {"SR", "C", "L"}, r


@pytest.mark.parametrize(
    "rows,overrides,words",
    [
        ([], [], ["has no responses"]),
        (MATH_ROWS, ["view=zzz"], ["view='zzz'", "no response with that id", "a1, a2, b1, b2"]),
        (MATH_ROWS, ["reward=ttrl", "view=a1"], ["view=a1", "reward=ttrl", "no reasoning maps"]),
        (MATH_ROWS, ["reward=lcs", "plot=true"], ["plot=true", "reward=lcs", "no reasoning maps"]),
        ([{"response": "\\boxed{1}"}], ["reward=empo"], ["line 1", "reward=empo", '"group"']),
        ([*MATH_ROWS[:3], {"response": "\\boxed{4}"}], ["reward=ground_truth"], ['"ground_truth"', "line 4"]),
        ([{"response": "x", "group": True}], [], ["line 1", '"group" is true']),
    ],
)
def test_refuses_in_one_line(tmp_path, rows, overrides, words):
    """An empty file, an id that is not in it, maps of a reward without them, a group reward without groups, a
    gold answer missing where the reward needs one, a field of the wrong type: exit 2, one line, no output."""
    src = write_rows(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    proc = run_module("sarl.score", f"hydra.run.dir={tmp_path}/run", f"input={src}", f"output={out}", *overrides)
    assert_one_line_error(proc, *words)
    assert not out.exists()
    assert not (tmp_path / "run").exists()  # a call that fails leaves no run folder behind


def test_a_call_leaves_a_run_folder_only_when_it_writes_into_it(tmp_path):
    """The run folder (runs/score/<date>/<time>/) stays only when the scores go into it: a call writing elsewhere,
    or failing, leaves none, nor the empty runs/score/ above it."""
    out = tmp_path / "elsewhere.jsonl"
    assert run_module("sarl.score", f"output={out}", cwd=tmp_path).returncode == 0 and out.is_file()
    assert run_module("sarl.score", "input=missing.jsonl", cwd=tmp_path).returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.jsonl"]
    assert run_module("sarl.score", cwd=tmp_path).returncode == 0
    assert len(list((tmp_path / "runs" / "score").glob("*/*/scores.jsonl"))) == 1


def test_each_reward_call_gets_whole_groups():
    assert reward_calls(["a", "b", "a", "c", "c", "c"], 3) == [[0, 2, 1], [3, 4, 5]]
    assert reward_calls(["a"] * 4 + ["b"], 2) == [[0, 1, 2, 3], [4]]  # a group larger than batch_size stays whole
    assert reward_calls([str(i) for i in range(5)], 2) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    "text,error",
    [
        ('{"response": "ok"}\n{"text": "no response field"}\n', "line 2"),
        ("not json\n", "line 1: not valid JSON"),
        ('{"response": "ok", "extra_info": [1]}\n', 'line 1: "extra_info" is \\[1\\], not an object'),
    ],
)
def test_bad_input_file_names_the_line(tmp_path, text, error):
    src = tmp_path / "bad.jsonl"
    src.write_text(text)
    with pytest.raises(ValueError, match=error):
        read_responses(src)
