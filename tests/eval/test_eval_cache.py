"""The per-sample cache and atomic writes: what an interrupted evaluation resumes from."""

import json
import os

import pytest

from eval.cache import SampleCache, atomic_write_text, safe_name, stable_hash


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "results.json"
    atomic_write_text(path, "old")
    assert path.read_text() == "old"

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temporary file left behind


def test_cache_round_trip_and_resume_from_disk(tmp_path):
    cache = SampleCache(tmp_path)
    cache.put("aime25", "p/1", "h1", 0, {"text": "a"})
    cache.put("aime25", "p/1", "h1", 3, {"text": "d"})
    assert cache.get("aime25", "p/1", "h1") == {0: {"text": "a"}, 3: {"text": "d"}}
    fresh = SampleCache(tmp_path)  # a new process after an interruption
    assert fresh.get("aime25", "p/1", "h1") == {0: {"text": "a"}, 3: {"text": "d"}}
    assert fresh.get("aime25", "other", "h1") == {}
    files = sorted((tmp_path / "aime25").rglob("*.json"))
    assert len(files) == 2 and json.loads(files[0].read_text())["problem_id"] == "p/1"


HOSTILE_TEXTS = {
    "lone surrogate": "raise ValueError('\ud800')  # \udfff too",
    "NUL": "a\x00b",
    "replacement and marks": "\ufffd\u200b\u202e<think>",
    "a megabyte": "x" * (1 << 20),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
def test_any_text_a_model_or_program_writes_is_stored_and_read_back(tmp_path, name):
    """A response or a program's output is cached and read back as it was, whatever it holds (a lone surrogate made
    every write raise UnicodeEncodeError, so the sample was never cached and every rerun died at the same place);
    the reports written from it (JSON, Markdown) never fail."""
    text = HOSTILE_TEXTS[name]
    cache = SampleCache(tmp_path / "cache")
    cache.put("b", "p1", "h", 0, {"text": text, "judge": {"error": text}})
    again = SampleCache(tmp_path / "cache").get("b", "p1", "h")
    assert again == {0: {"text": text, "judge": {"error": text}}}
    report = tmp_path / "results.json"
    atomic_write_text(report, json.dumps({"answers": [text]}, ensure_ascii=False))
    assert json.loads(report.read_text(encoding="utf-8")) == {"answers": [text]}
    atomic_write_text(tmp_path / "results.md", f"| {text} |")  # Markdown: the escape stands for the character
    assert (tmp_path / "results.md").read_text(encoding="utf-8").startswith("| ")


def test_changed_prompt_ignores_old_samples(tmp_path):
    cache = SampleCache(tmp_path)
    cache.put("b", "p1", "old-hash", 0, {"text": "stale"})
    fresh = SampleCache(tmp_path)
    assert fresh.get("b", "p1", "new-hash") == {}
    assert fresh.counts["stale_samples"] == 1
    fresh.put("b", "p1", "new-hash", 0, {"text": "fresh"})
    assert SampleCache(tmp_path).get("b", "p1", "new-hash") == {0: {"text": "fresh"}}


def test_unreadable_cache_file_is_counted_and_recomputed(tmp_path):
    cache = SampleCache(tmp_path)
    cache.put("b", "p1", "h", 0, {"text": "x"})
    next((tmp_path / "b").rglob("*.json")).write_text("{not json")
    fresh = SampleCache(tmp_path)
    assert fresh.get("b", "p1", "h") == {}
    assert fresh.counts["unreadable_files"] == 1


def test_safe_names_do_not_collide():
    assert safe_name("aime25") == "aime25"
    names = {safe_name(x) for x in ("a b", "a_b", "a/b", "a:b")}
    assert len(names) == 4
    assert safe_name("a_b") == "a_b"
    long = safe_name("x" * 300)
    assert len(long) <= 80
    assert stable_hash({"b": 1, "a": 2}) == stable_hash({"a": 2, "b": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})


def test_a_malformed_record_is_warned_about_and_recomputed(tmp_path, caplog):
    """Valid JSON of the wrong shape (or a record the stage rejects) names its file and is left out; the
    evaluation goes on."""
    cache = SampleCache(tmp_path)
    cache.put("b", "p1", "h", 0, {"text": "x"})
    cache.put("b", "p1", "h", 1, {"text": None})
    cache.put("b", "p1", "h", 2, {"text": "z"})
    files = sorted((tmp_path / "b").rglob("*.json"))
    files[2].write_text(json.dumps([1, 2, 3]))
    fresh = SampleCache(tmp_path)
    assert fresh.get("b", "p1", "h", valid=lambda r: isinstance(r.get("text"), str)) == {0: {"text": "x"}}
    assert fresh.counts["malformed_files"] == 2
    assert str(files[1]) in caplog.text and str(files[2]) in caplog.text


def test_checkpoint_fingerprint_follows_the_contents_not_the_path_name_or_time(tmp_path):
    import shutil

    from eval.cache import FileDigests, checkpoint_fingerprint

    ckpt = tmp_path / "final"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"a": 1}')
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "x"}')
    weights = ckpt / "model.safetensors"
    weights.write_bytes(b"\0" * (3 << 20))
    (ckpt / "trainer_state.json.lock").write_text("ignored")
    first = checkpoint_fingerprint(ckpt)
    assert first == checkpoint_fingerprint(ckpt) and len(first) == 16
    copy = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(ckpt, copy)  # another path, another name, new modification times
    os.utime(copy / "model.safetensors", ns=(1, 1))
    assert checkpoint_fingerprint(copy) == first
    stat = weights.stat()
    weights.write_bytes(b"\0" * (1 << 20) + b"\1" + b"\0" * ((2 << 20) - 1))  # re-saved: same size, a middle byte
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old modification time
    second = checkpoint_fingerprint(ckpt)
    assert second != first
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "y"}')
    assert checkpoint_fingerprint(ckpt) not in (first, second)
    assert checkpoint_fingerprint("Qwen/Qwen3-4B") is None  # a name: its name is its identity

    memo = tmp_path / "digests.json"
    assert checkpoint_fingerprint(copy, FileDigests(memo)) == first and memo.is_file()
    again = FileDigests(memo)
    assert checkpoint_fingerprint(copy, again) == first and not again.changed  # nothing read again
    (copy / "config.json").write_text('{"a": 2}')
    assert checkpoint_fingerprint(copy, again) != first and again.changed is False  # saved after hashing anew
    memo.write_text("not json")
    assert checkpoint_fingerprint(ckpt, FileDigests(memo)) == checkpoint_fingerprint(ckpt)  # a bad memo: hashed anew
