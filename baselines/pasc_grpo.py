"""PASC-GRPO's advantage: Stratified Clipping Advantage Estimation (SCAE; GRP Sec. 3.2.2, Eq. 14-16).

Per group, with mean accuracy r̄ and mean aux reward r̄+ / r̄- over its correct / wrong rollouts:
correct A_i = (1 - r̄) + max(0, aux_i - r̄+); wrong A_j = -r̄ + min(0, aux_j - r̄-); no std normalisation.
The aux reward is GRP's R_graph (`baselines.grp`).

A verl advantage estimator sees only the scalar reward, so `GRPReward(combine="scae")` packs accuracy and
R_graph into one score (`pack_scae`) and the `scae` estimator unpacks it (`unpack_scae`). The estimator is
registered with verl by `register_verl`, which `conf/algorithm/pasc_grpo.yaml` names
(`adv_estimator_register`): verl's trainer calls it in its own process before training.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SCAE_ESTIMATOR = "scae"


def scae_advantages(acc: np.ndarray, aux: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """GRP Eq. (14)-(16): per group, A_i = (1 - r̄) + max(0, aux_i - r̄+) for a correct rollout and
    A_j = -r̄ + min(0, aux_j - r̄-) for a wrong one; r̄ the group's mean accuracy, r̄+ / r̄- the mean aux
    reward over its correct / wrong rollouts. Accuracy must be 0 or 1."""
    acc = np.asarray(acc, dtype=np.float64)
    aux = np.asarray(aux, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if not (acc.ndim == aux.ndim == group_ids.ndim == 1 and len(acc) == len(aux) == len(group_ids)):
        raise ValueError(
            f"acc, aux and group_ids must be 1-D of one length, got {acc.shape}, {aux.shape}, {group_ids.shape}"
        )
    if not np.isin(acc, (0.0, 1.0)).all():
        raise ValueError(f"SCAE needs accuracy in {{0, 1}}, got {sorted(set(acc.tolist()) - {0.0, 1.0})[:5]}")
    if not np.isfinite(aux).all():
        raise ValueError("SCAE needs finite auxiliary rewards")
    adv = np.zeros(len(acc))
    _, group = np.unique(group_ids, return_inverse=True)
    for g in range(group.max() + 1 if len(group) else 0):
        rows = np.flatnonzero(group == g)
        correct = acc[rows] == 1.0
        mean_acc = acc[rows].mean()
        right, wrong = rows[correct], rows[~correct]
        if len(right):  # Eq. (15): structure is only a bonus
            adv[right] = (1.0 - mean_acc) + np.maximum(0.0, aux[right] - aux[right].mean())
        if len(wrong):  # Eq. (16): structure is only a penalty
            adv[wrong] = (0.0 - mean_acc) + np.minimum(0.0, aux[wrong] - aux[wrong].mean())
    return adv


# The packed score: correct -> 2 + aux in [2, 3], wrong -> aux - 3 in [-3, -2], so that the two bands cannot
# be confused with each other nor with a plain [-1, 1] reward (a misconfigured run fails loudly).
_SCAE_CORRECT, _SCAE_WRONG = 2.0, -3.0


def pack_scae(acc: float, aux: float) -> float:
    """One scalar that carries accuracy (0/1) and an aux reward in [0, 1] to the `scae` estimator."""
    if acc not in (0.0, 1.0) or not 0.0 <= aux <= 1.0:
        raise ValueError(f"pack_scae needs acc in {{0, 1}} and aux in [0, 1], got acc={acc}, aux={aux}")
    return (_SCAE_CORRECT if acc == 1.0 else _SCAE_WRONG) + aux


def unpack_scae(scores: np.ndarray, tol: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """(acc, aux) from packed scores; ValueError if a score lies in neither band (not a packed score)."""
    scores = np.asarray(scores, dtype=np.float64)
    acc = (scores > 0).astype(np.float64)
    aux = scores - np.where(acc == 1.0, _SCAE_CORRECT, _SCAE_WRONG)
    bad = ~((aux >= -tol) & (aux <= 1.0 + tol))
    if bad.any():
        raise ValueError(
            f"the scae advantage estimator got rewards {scores[bad][:5].tolist()} outside [-3, -2] U [2, 3]: "
            "it needs reward=grp with reward.combine=scae (accuracy and R_graph packed by "
            "baselines.pasc_grpo.pack_scae)"
        )
    return acc, np.clip(aux, 0.0, 1.0)


def register_verl() -> None:
    """Registers SCAE as verl's advantage estimator `scae` (`algorithm.adv_estimator=scae`); idempotent.
    It must run in the process that computes advantages (verl's trainer)."""
    import torch
    from verl.trainer.ppo import core_algos

    if SCAE_ESTIMATOR in core_algos.ADV_ESTIMATOR_REGISTRY:
        return

    @core_algos.register_adv_est(SCAE_ESTIMATOR)
    def compute_scae_outcome_advantage(
        token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PASC-GRPO's SCAE (GRP Eq. 14-16) on packed GRP scores, grouped by uid; outcome only."""
        with torch.no_grad():
            acc, aux = unpack_scae(token_level_rewards.sum(dim=-1).double().cpu().numpy())
            adv = scae_advantages(acc, aux, np.asarray(index))
            scores = torch.as_tensor(adv, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
            advantages = scores.unsqueeze(-1) * response_mask
        return advantages, advantages
