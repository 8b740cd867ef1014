"""ORPO's run setting: a sub-model of :class:`trnqwen.config.RunConfig` (flat name ``orpo_lambda``:
``--orpo-lambda``, ``TRNQWEN_ORPO_LAMBDA``, ``orpo_lambda`` in trnqwen.toml)."""

from __future__ import annotations

from pydantic import BaseModel

from trnqwen.settings import setting


class OrpoSettings(BaseModel):
    orpo_lambda: float = setting(
        0.1, gt=0.0, le=100.0, allow_inf_nan=False,
        help="ORPO: weight of the odds-ratio term beside the chosen answers' NLL (TRL's beta).", panel="Method",
    )
