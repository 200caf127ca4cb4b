"""The generator `eval.run` uses where vLLM cannot be imported (a CPU-only machine, eval.config.usable_generator):
the default gives way to Transformers, said in one line; an explicit `generator=vllm` stops with one line that
names the fix, before the run directory is made."""

import logging
import sys

import pytest
from testkit import run_module, without_vllm

from eval import config as eval_config
from eval.config import compose_eval_config, generator_chosen, generator_name, usable_generator, vllm_unavailable
from sarl.runtime.errors import UserError

FALLBACK = "generating with Transformers (generator=transformers; slow, for CPU checks)"


def test_a_generator_is_chosen_by_naming_it_or_setting_one_of_its_keys():
    assert not generator_chosen(["ckpt=x", "protocol=smoke", "limit=4", "judge.url=http://j/v1"])
    for override in ("generator=vllm", "generator.backend=openai", "generator.dtype=float32", "+generator.x.y=1"):
        assert generator_chosen(["ckpt=x", override]), override


def test_the_default_vllm_gives_way_to_transformers_only_where_it_cannot_be_imported(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="eval.run")
    monkeypatch.setattr(eval_config, "vllm_unavailable", lambda: None)
    assert generator_name(usable_generator(compose_eval_config(["ckpt=x"]), False)) == "vllm"
    assert not caplog.records
    monkeypatch.setattr(eval_config, "vllm_unavailable", lambda: "is not installed here")
    cfg = usable_generator(compose_eval_config(["ckpt=x"]), False)
    assert generator_name(cfg) == "transformers" and cfg.generator.device == "auto"
    assert [r.getMessage() for r in caplog.records] == [f"vLLM is not installed here: {FALLBACK}"]
    with pytest.raises(UserError, match=r"generator=vllm but vLLM is not installed here: install the gpu extra"):
        usable_generator(compose_eval_config(["ckpt=x", "generator=vllm"]), True)
    chosen = compose_eval_config(["ckpt=x", "generator=openai", "generator.url=http://127.0.0.1:9/v1"])
    assert usable_generator(chosen, True) is chosen and generator_name(chosen) == "openai"  # no vLLM needed


def test_a_vllm_whose_import_fails_counts_as_missing(tmp_path, monkeypatch):
    """A broken install (its import raises) cannot generate either: the reason names the import's error."""
    import importlib

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text('raise ImportError("libcudart.so.12: cannot open shared object")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    importlib.invalidate_caches()
    assert vllm_unavailable() == "cannot be imported here (ImportError: libcudart.so.12: cannot open shared object)"


def test_an_explicit_vllm_without_vllm_is_one_line_before_the_run_directory_is_made(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    args = [f"ckpt={ckpt}", "protocol=smoke", "generator=vllm", f"paths.root={tmp_path}", "logger=none"]
    proc = run_module("eval.run", *args, env=without_vllm(tmp_path / "site"), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for words in ("generator=vllm but vLLM is not installed here", "pip install -e '.[gpu]'", "generator=transformers"):
        assert words in lines[0], (words, lines[0])
    assert not (tmp_path / "runs" / "eval" / "ckpt").exists()  # no run directory (runs/eval/<name>/<date>_<time>)
