"""What `VERL_USE_EXTERNAL_MODULES` names in a `backend=verl_cpu` run: imported by `import verl` in every process
of the run (verl/__init__.py:49-52), it registers the "cpu" platform (`VERL_PLATFORM=cpu` selects it), patches
the places where verl assumes an accelerator (sarl.backends.verl.cpu.platform) and registers the "hf" rollout by
name (its module, sarl.backends.verl.cpu.rollout, is imported where verl builds a rollout). Never imported in a
GPU run."""

from verl.workers.rollout import base, replica

from sarl.backends.verl.cpu import platform

ROLLOUT = "hf"
ROLLOUT_MODULE = "sarl.backends.verl.cpu.rollout"


def _replica() -> type:
    # deferred: cycle: `import verl` imports this module (verl's external libs), and the rollout imports verl
    from sarl.backends.verl.cpu.rollout import HFReplica

    return HFReplica


platform.patch_verl()
base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{ROLLOUT_MODULE}.HFServerAdapter"
replica.RolloutReplicaRegistry.register(ROLLOUT, _replica)
