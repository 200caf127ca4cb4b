"""The Hugging Face Hub from this machine (sarl/runtime/hub.py), without the network: HF_ENDPOINT points at a closed
loopback port (unreachable) or at a listening socket of the test (reachable). Offline mode when the Hub cannot be
reached, set by every entry point before it works; a model that cannot be had here refused before anything is built
or written, except in a dry run."""

import logging
import os
import socket
import subprocess
import sys

import huggingface_hub.constants
import pytest
from testkit import REPO

from sarl.runtime import hub
from sarl.runtime.errors import UserError
from sarl.runtime.hub import OFFLINE_VARS, check_model_source, hub_reachable, offline_if_unreachable, offline_note


@pytest.fixture
def closed_endpoint(monkeypatch):
    """HF_ENDPOINT at a loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    return port


@pytest.fixture
def listening_endpoint(monkeypatch):
    """HF_ENDPOINT at a loopback socket that listens (the kernel completes the handshake; nothing is served)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
        yield


@pytest.fixture
def online(monkeypatch):
    """Neither offline variable set (the tests run with both set: tests/conftest.py)."""
    for name in OFFLINE_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of the test's own; `cache.add(repo)` puts a config.json of `repo` in it."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    class Cache:
        path = cache

        def add(self, repo: str) -> None:
            folder = cache / f"models--{repo.replace('/', '--')}"
            (folder / "refs").mkdir(parents=True)
            (folder / "refs" / "main").write_text("abc")
            (folder / "snapshots" / "abc").mkdir(parents=True)
            (folder / "snapshots" / "abc" / "config.json").write_text("{}")

    return Cache()


def test_the_hub_is_reachable_when_its_port_accepts_a_connection(closed_endpoint, monkeypatch):
    assert hub_reachable(timeout_s=1) is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}/")
        assert hub_reachable(timeout_s=1) is True


def test_offline_mode_only_when_the_hub_cannot_be_reached_and_the_user_chose_nothing(
    online, closed_endpoint, monkeypatch, caplog
):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_SWITCHED", [])
    assert offline_note() is None
    with caplog.at_level(logging.INFO, logger="sarl.runtime.hub"):
        offline_if_unreachable()
    assert [os.environ[name] for name in OFFLINE_VARS] == ["1", "1"]
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # already imported: its flag follows
    assert caplog.records == []  # silent: the command says it once its checks passed
    assert f"127.0.0.1:{closed_endpoint}" in offline_note() and "offline mode" in offline_note()
    for name in OFFLINE_VARS:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user's choice stands
    offline_if_unreachable()
    assert os.environ["HF_HUB_OFFLINE"] == "0" and "TRANSFORMERS_OFFLINE" not in os.environ


def test_a_reachable_hub_keeps_the_libraries_online(online, listening_endpoint):
    offline_if_unreachable()
    assert not any(name in os.environ for name in OFFLINE_VARS)


def test_a_model_is_a_checkpoint_directory_or_a_hub_id_that_can_be_had(tmp_path, hub_cache, closed_endpoint):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(UserError, match=r"model.path=.*ckpt has no config.json"):
        check_model_source("model.path", str(ckpt))
    (ckpt / "config.json").write_text("{}")
    assert check_model_source("model.path", str(ckpt)) is None
    for local in (str(tmp_path / "nope"), "./nope", "~/nope", "a/b/c"):  # a local path is never a Hub id
        with pytest.raises(UserError, match="is not a directory"):
            check_model_source("model.path", local, dry_run=True)
    with pytest.raises(UserError) as err:
        check_model_source("model.path", "org/missing")
    assert str(err.value) == (
        f"model.path=org/missing: no such directory, and not in the Hugging Face cache ({hub_cache.path}) with the hub "
        "unreachable: give a local checkpoint directory or download the model first (hf download org/missing)"
    )
    note = check_model_source("model.path", "org/missing", dry_run=True)  # a dry run loads nothing: a note
    assert note.startswith("model.path=org/missing: no such directory") and "the dry run goes on" in note
    hub_cache.add("org/cached")
    assert check_model_source("model.path", "org/cached") is None


def test_a_hub_id_is_fine_when_the_hub_can_be_reached_unless_the_user_went_offline(
    hub_cache, online, listening_endpoint, monkeypatch
):
    assert check_model_source("model.path", "org/missing") is None  # the run downloads it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"with the hub offline \(HF_HUB_OFFLINE=1\)"):
        check_model_source("ckpt", "org/missing")


def command(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m module args` as a user runs it (one or two lines for a mistake), with neither offline variable
    set."""
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARS}
    env.update(HYDRA_FULL_ERROR="0", SARL_DEBUG="0")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    "module,args",
    [
        ("sarl.train", ["+exp=smoke", "train.rollout_nn=8"]),
        ("sarl.preflight", ["+exp=smoke", "train.rollout_nn=8"]),
        ("eval.run", ["ckpt=x", "sampling.nn=2"]),
    ],
)
def test_every_entry_point_goes_offline_first_when_the_hub_cannot_be_reached(module, args, closed_endpoint):
    """Offline at once, silently: a one-line error stays one line (the offline line comes once the checks passed)."""
    proc = command(module, *args)  # HF_ENDPOINT: the closed port
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (error,) = proc.stderr.strip().splitlines()
    assert "no such key; did you mean" in error


def test_the_offline_line_comes_once_the_checks_passed(closed_endpoint):
    proc = command("sarl.train", "+exp=smoke", "train.dry_run=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"127.0.0.1:{closed_endpoint}) cannot be reached: offline mode" in proc.stderr


def test_data_prepare_goes_offline_first_and_fails_in_one_line_without_retrying(closed_endpoint, tmp_path):
    """A Hub data set that is not cached, with the Hub unreachable: the one-line error, which says the Hub is
    unreachable, and none of huggingface_hub's retries (five, 23 s, before `sarl.data.prepare` went offline first)."""
    env = {k: v for k, v in os.environ.items() if k not in (*OFFLINE_VARS, "HF_DATASETS_OFFLINE")}
    env.update(SARL_ROOT=str(tmp_path), HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [sys.executable, "-m", "sarl.data.prepare", "dataset=aime25"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out[-2000:]
    assert "Retry" not in out and "thrown while requesting" not in out, out[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: dataset 'aime25': cannot load 'math-ai/aime25'")
    assert "from the Hugging Face Hub (unreachable here: offline mode)" in last


def test_offline_mode_reaches_datasets_when_it_was_imported_first(online, closed_endpoint, monkeypatch):
    import datasets.config

    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    offline_if_unreachable()
    assert datasets.config.HF_HUB_OFFLINE is True and datasets.config.HF_DATASETS_OFFLINE is True
