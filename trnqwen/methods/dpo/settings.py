"""DPO's run settings: a sub-model of :class:`trnqwen.config.RunConfig` (its fields keep the flat
names users have: ``beta``/``dpo_loss`` in trnqwen.toml, ``--beta``/``--dpo-loss``,
``TRNQWEN_BETA``/``TRNQWEN_DPO_LOSS``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

LOSS_TYPES = ("sigmoid", "ipo")
DpoLoss = Literal["sigmoid", "ipo"]


class DpoSettings(BaseModel):
    beta: float = Field(0.1, gt=0.0, le=100.0, allow_inf_nan=False, description="DPO: strength of the pull toward the reference.")
    dpo_loss: DpoLoss = Field("sigmoid", description="DPO loss: sigmoid (DPO's) or ipo.")
