"""DPO's run settings: a sub-model of :class:`trnqwen.config.RunConfig` (its fields keep the flat
names users have: ``beta``/``dpo_loss`` in trnqwen.toml, ``--beta``/``--dpo-loss``,
``TRNQWEN_BETA``/``TRNQWEN_DPO_LOSS``)."""

from __future__ import annotations

from typing import Literal

from trnqwen.methods.pair_settings import PairSettings
from trnqwen.settings import setting

LOSS_TYPES = ("sigmoid", "ipo")
DpoLoss = Literal["sigmoid", "ipo"]


class DpoSettings(PairSettings):  # answer_end: every pair method's (methods/pair_settings.py)
    beta: float = setting(
        0.1, gt=0.0, le=100.0, allow_inf_nan=False,
        help="DPO: how strongly the tuned model is held to the reference (rewards are beta x log-ratio).", panel="Method",
    )
    dpo_loss: DpoLoss = setting("sigmoid", help="DPO loss: sigmoid (DPO's; ln 2 at step 1) or ipo.", panel="Method")
