"""How long a verl RL run trains: its training steps and optimiser updates, as verl will count them.

verl's RL trainer batches the prompts with `drop_last=True` (`verl/trainer/ppo/ray_trainer.py`,
`_create_dataloader`), so an epoch is `prompts // train_batch_size` steps and the last partial batch is left out
every epoch (with `train.shuffle: false`, the same prompts every epoch); it trains `steps a epoch x total_epochs`
steps, or `trainer.total_training_steps` when set (the learning-rate schedule's length; the loop still stops after
the epochs). Each step updates the actor once per PPO mini-batch: `train_batch_size / ppo_mini_batch_size` times
(verl's `ppo_epochs` is 1 here). The dry run prints this plan (`sarl.train ... train.dry_run=true`), the preflight
sizes the run's checkpoints by it, and `tests/sarl/backends/test_verl_steps.py` holds every verl paper row's number.

The prompt count is the prepared training file's, else the data config's `expected_count` times its `repeat` (the
set as `sarl.data.prepare` will write it); prompts longer than `train.max_prompt_length`, which verl filters out at
start-up, are not subtracted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig


@dataclass(frozen=True)
class StepPlan:
    prompts: int  # training prompts, as verl reads them (repeats included)
    counted_from: str  # "the prepared file" | "conf/data/NAME.yaml expected_count [x repeat]"
    batch: int  # prompts a step (train.train_batch_size)
    epochs: int
    capped_at: int | None  # train.total_training_steps, when set
    updates_per_step: int  # optimiser updates a step (PPO mini-batches)
    shuffle: bool = True  # train.shuffle: false leaves the same prompts out every epoch

    @property
    def per_epoch(self) -> int:
        return self.prompts // self.batch

    @property
    def left_out(self) -> int:
        """Prompts of each epoch's last partial batch, which verl drops."""
        return self.prompts % self.batch

    @property
    def steps(self) -> int:
        full = self.per_epoch * self.epochs
        return min(full, self.capped_at) if self.capped_at else full

    @property
    def updates(self) -> int:
        return self.steps * self.updates_per_step

    def describe(self) -> str:
        """One line: the steps and updates, and how they follow from the data and the batch sizes."""
        same = " (the same ones: train.shuffle=false)" if not self.shuffle else ""
        left = f", {self.left_out} left out each epoch{same}" if self.left_out else ""
        cap = f", capped at train.total_training_steps={self.capped_at}" if self.capped_at else ""
        return (
            f"{self.steps:,} training steps ({self.prompts:,} prompts [{self.counted_from}] // batch {self.batch} = "
            f"{self.per_epoch:,} a epoch{left}, x {self.epochs} epoch(s){cap}); {self.updates_per_step} optimiser "
            f"update(s) a step: {self.updates:,} updates"
        )


def step_plan(cfg: DictConfig) -> StepPlan | None:
    """The run's step plan, or None when the number of prompts is unknown (no prepared file, no expected_count)."""
    t = cfg.train
    path = Path(str(cfg.data.get("train_files") or ""))
    prompts, counted_from = None, ""
    if path.is_file():
        import pyarrow.parquet as pq  # deferred: pyarrow is loaded only when a prepared file is there to read

        prompts, counted_from = pq.read_metadata(path).num_rows, "the prepared file"
    elif cfg.data.get("expected_count"):
        repeat = int(cfg.data.get("repeat") or 1)
        prompts = int(cfg.data.expected_count) * repeat
        counted_from = f"conf/data/{cfg.data.name}.yaml expected_count" + (f" x repeat {repeat}" if repeat > 1 else "")
    if prompts is None:
        return None
    batch, mini = int(t.train_batch_size), int(t.ppo_mini_batch_size)
    capped = t.get("total_training_steps")
    epochs, cap = int(t.total_epochs), int(capped) if capped else None
    return StepPlan(prompts, counted_from, batch, epochs, cap, batch // mini, bool(t.get("shuffle", True)))
