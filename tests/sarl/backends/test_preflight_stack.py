"""The preflight's stack checks as strict as the first run: a driver too old for the CUDA the torch wheels were built
for, and a flash-attn whose compiled extension does not import (a wheel built for another torch), both fail on the
node before any GPU hour is spent. CPU only: the GPU, the driver and flash-attn are faked."""

import logging
import sys

import pytest

from sarl.backends.verl import preflight as verl_preflight
from sarl.runtime import node_checks
from sarl.runtime.checks import Check

UNDEFINED_SYMBOL = (
    "/venv/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: "
    "undefined symbol: _ZN3c104cuda9SetDeviceEab"
)


# -- the driver against the wheels' CUDA -------------------------------------------------------


@pytest.mark.parametrize(
    "cuda, driver",
    [
        ("13.0", "580.65.06"),  # the oldest driver CUDA 13 runs on
        ("13.0", "580.82.07"),
        ("13.1", "590.44.01"),
        ("12.8", "550.54.15"),  # minor version compatibility: any 12.x on a 525+ driver
        ("12.10", "525.60.13"),
        ("12.4", "525.100.1"),  # 100 > 60: numbers, not strings ("525.100" < "525.60" as text)
        ("11.8", "470.82.01"),
        ("13.0", "1000.1"),
    ],
)
def test_a_driver_new_enough_for_the_cuda_of_torch_passes(cuda, driver):
    """At or above the minimum of the CUDA major version: no problem."""
    assert node_checks.driver_problem(cuda, driver) is None


@pytest.mark.parametrize(
    "cuda, driver, need",
    [
        ("13.0", "575.57.08", "580.65.06"),
        ("13.0", "550.54.15", "580.65.06"),
        ("13.0", "580.65.05", "580.65.06"),
        ("12.4", "520.0", "525.60.13"),
        ("12.10", "520.61.05", "525.60.13"),  # CUDA 12.10 is major 12, not "1"
        ("11.0", "450.51.06", "450.80.02"),
    ],
)
def test_a_driver_too_old_for_the_cuda_of_torch_is_named_with_the_minimum(cuda, driver, need):
    """Below the minimum: one line naming both versions."""
    problem = node_checks.driver_problem(cuda, driver)
    assert problem == f"torch built for CUDA {cuda} needs NVIDIA driver >= {need}; this node has {driver}"


def test_versions_compare_as_numbers():
    """Versions are tuples of ints, not strings."""
    assert node_checks.version_numbers("580.65.06") == (580, 65, 6)
    assert node_checks.version_numbers("12.10") > node_checks.version_numbers("12.9")
    assert node_checks.MIN_DRIVER[13] == "580.65.06" and node_checks.MIN_DRIVER[12] == "525.60.13"


@pytest.mark.parametrize(
    "cuda, driver",
    [(None, "550.54.15"), ("13.0", None), (None, None), ("", ""), ("13.0", "N/A"), ("14.0", "300.1"), ("10.2", "1")],
)
def test_an_unknown_cuda_or_driver_reports_no_problem(cuda, driver):
    """No CUDA, no driver, or a CUDA major version without a known minimum."""
    assert node_checks.driver_problem(cuda, driver) is None


def stack_row(monkeypatch, cuda, driver, available=True):
    """The "torch / CUDA / driver" row of check_stack on a node whose torch is built for `cuda`, sees a GPU
    (`available`) and has NVIDIA driver `driver`."""
    pytest.importorskip("verl")  # check_stack's flash-attn row: sarl.backends.verl.attention
    import torch

    real = verl_preflight.installed_version
    monkeypatch.setattr(verl_preflight, "installed_version", lambda pkg: "2.11.0" if pkg == "torch" else real(pkg))
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(verl_preflight, "driver_version", lambda: driver)
    (row,) = [c for c in verl_preflight.check_stack() if c.name == "torch / CUDA / driver"]
    return row


def test_check_stack_fails_a_driver_too_old_for_the_wheels_cuda(monkeypatch):
    """The CUDA 13 wheels on a 550 driver: the row fails with the fix."""
    row = stack_row(monkeypatch, "13.0", "550.54.15")
    assert not row.ok
    assert row.detail == "torch built for CUDA 13.0 needs NVIDIA driver >= 580.65.06; this node has 550.54.15"
    assert row.fix.startswith("update the driver, or install a torch built for the node's CUDA")
    assert "https://download.pytorch.org/whl/cu12" in row.fix


def test_check_stack_passes_a_driver_new_enough(monkeypatch):
    """The CUDA 13 wheels on a 580 driver: the row passes as before."""
    row = stack_row(monkeypatch, "13.0", "580.82.07")
    assert row.ok and row.detail == "torch 2.11.0, CUDA 13.0, driver 580.82.07" and row.fix == ""


def test_check_stack_says_when_it_cannot_check_the_driver(monkeypatch):
    """A CUDA major version without a known minimum passes, and says so."""
    row = stack_row(monkeypatch, "14.0", "600.10.01")
    assert row.ok and "driver not checked: no known minimum for CUDA 14.0" in row.detail


def test_check_stack_on_a_cpu_build_of_torch_still_fails_as_before(monkeypatch):
    """No CUDA build, no driver: the old failure and fix."""
    row = stack_row(monkeypatch, None, None, available=False)
    assert not row.ok and "CPU build" in row.detail and "pip install -r requirements/gpu.lock" in row.fix


def test_a_cpu_row_is_checked_against_the_cpu_stack_it_runs_on():
    """`backend=verl_cpu` (what CI rehearses the GPU session with) needs no CUDA, vLLM or GPU: its rows are verl and
    requirements/cpu.lock, and this environment (made from that lock) passes them."""
    from sarl.launch.compose import compose_user_config
    from sarl.preflight import preflight

    rows = verl_preflight.check_cpu_stack()
    assert [r.name for r in rows] == ["verl", "stack = requirements/cpu.lock"] and all(r.ok for r in rows), rows
    cfg, choices = compose_user_config(["+exp=grpo_sarl_math", "backend=verl_cpu"])
    names = [c.name for c in preflight(cfg, choices)]
    assert "GPUs" not in names and "vllm" not in names and "torch / CUDA / driver" not in names, names
    assert "stack = requirements/cpu.lock" in names


# -- flash-attn imported for real ----------------------------------------------------------------


@pytest.fixture
def attention(monkeypatch):
    """sarl.backends.verl.attention with its per-process caches cleared before and after, and no flash_attn
    module imported (the fakes below are imported afresh)."""
    pytest.importorskip("verl")
    from sarl.backends.verl import attention

    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    cached = (attention.flash_attn_usable, attention.flash_attn_import_error)  # a test may replace them
    for f in cached:
        f.cache_clear()
    yield attention
    for f in cached:
        f.cache_clear()
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        sys.modules.pop(name)


def fake_flash_attn(monkeypatch, root, interface: str):
    """A flash_attn package on sys.path laid out as flash-attn 2.x is (its __init__ imports flash_attn_interface,
    which imports the compiled extension), with `interface` as flash_attn_interface's source; transformers'
    metadata check reports it available, so that only the real import decides."""
    import transformers.utils

    package = root / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text(
        '__version__ = "2.8.3"\nfrom flash_attn.flash_attn_interface import flash_attn_func\n'
    )
    (package / "flash_attn_interface.py").write_text(interface)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)


def test_a_flash_attn_built_for_another_torch_is_not_usable(attention, monkeypatch, tmp_path, caplog):
    """An ABI mismatch at import: not usable, logged once with the fix, auto gives sdpa."""
    fake_flash_attn(monkeypatch, tmp_path, f"raise ImportError({UNDEFINED_SYMBOL!r})\n")
    with caplog.at_level(logging.WARNING, logger=attention.__name__):
        assert attention.flash_attn_usable() is False
        assert attention.flash_attn_usable() is False  # cached: tried and logged once per process
    (record,) = [r for r in caplog.records if r.name == attention.__name__]
    assert record.levelno == logging.WARNING
    assert "flash-attn is installed but does not import" in record.getMessage()
    assert "undefined symbol: _ZN3c104cuda9SetDeviceEab" in record.getMessage()
    assert "pip install flash-attn --no-build-isolation" in record.getMessage()
    assert "backend.attn_implementation=sdpa" in record.getMessage()
    assert attention.flash_attn_import_error().startswith("ImportError: /venv/lib/python3.11/site-packages/flash_attn")
    assert attention.resolve_attn_implementation("auto") == "sdpa"
    with pytest.raises(ValueError, match="not importable"):
        attention.resolve_attn_implementation("flash_attention_2")


@pytest.mark.parametrize("error", ["OSError('libcudart.so.13: cannot open shared object file')", "RuntimeError('x')"])
def test_any_error_of_the_import_means_not_usable(attention, monkeypatch, tmp_path, error):
    """A missing library or a runtime error at import: not usable either."""
    fake_flash_attn(monkeypatch, tmp_path, f"raise {error}\n")
    assert attention.flash_attn_usable() is False
    assert attention.flash_attn_import_error().split(":")[0] in ("OSError", "RuntimeError")


def test_a_flash_attn_that_imports_is_usable(attention, monkeypatch, tmp_path):
    """A package whose extension imports is usable: auto gives flash_attention_2."""
    fake_flash_attn(monkeypatch, tmp_path, "def flash_attn_func(*args, **kwargs):\n    return None\n")
    assert attention.flash_attn_import_error() is None
    assert attention.flash_attn_usable() is True
    assert attention.resolve_attn_implementation("auto") == "flash_attention_2"


def test_a_long_import_error_is_shortened_to_its_first_line(attention, monkeypatch, tmp_path):
    """The reason is the first line of the error, shortened."""
    fake_flash_attn(monkeypatch, tmp_path, f"raise ImportError('{'x' * 500}\\nsecond line')\n")
    err = attention.flash_attn_import_error()
    assert err.startswith("ImportError: xxx") and err.endswith("...") and len(err) < 230 and "second" not in err


def flash_attn_row(monkeypatch, attention, installed: str | None, import_error: str | None):
    """The flash-attn row of check_stack where the package metadata names version `installed` (None: not
    installed) and importing it fails with `import_error` (None: it imports)."""
    real = verl_preflight.installed_version
    names = ("flash-attn", "flash_attn")
    monkeypatch.setattr(verl_preflight, "installed_version", lambda pkg: installed if pkg in names else real(pkg))
    monkeypatch.setattr(attention, "flash_attn_import_error", lambda: import_error)
    monkeypatch.setattr(attention, "flash_attn_usable", lambda: import_error is None)
    (row,) = [c for c in verl_preflight.check_stack() if c.name == "flash-attn"]
    return row


def test_check_stack_fails_a_flash_attn_that_is_installed_but_does_not_import(monkeypatch, attention):
    """Installed but not importable: the row fails with the error and the fix."""
    row = flash_attn_row(monkeypatch, attention, "2.8.3", f"ImportError: {UNDEFINED_SYMBOL}")
    assert not row.ok
    assert row.detail == f"flash-attn 2.8.3 installed but does not import: ImportError: {UNDEFINED_SYMBOL}"
    assert "pip install flash-attn --no-build-isolation" in row.fix and "backend.attn_implementation=sdpa" in row.fix


def test_check_stack_passes_a_flash_attn_that_imports_and_one_not_installed(monkeypatch, attention):
    """Importable, or not installed (sdpa): the row passes."""
    row = flash_attn_row(monkeypatch, attention, "2.8.3", None)
    assert row.ok and row.detail == "flash-attn 2.8.3, usable: True"
    row = flash_attn_row(monkeypatch, attention, None, "ModuleNotFoundError: No module named 'flash_attn'")
    assert row.ok and row.detail.startswith("not installed: backend.attn_implementation=auto uses sdpa")


def test_the_attention_row_names_what_the_models_load_with(attention):
    """The attention row: the implementation every verl model loads with, or the invalid choice and its fix."""
    assert attention.check_attention("sdpa") == Check("attention", True, "actor, reference and critic load with sdpa")
    row = attention.check_attention("flash")
    assert not row.ok and "choose one of" in row.detail and row.fix == "backend.attn_implementation=auto"
