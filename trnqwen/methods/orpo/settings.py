"""ORPO's run setting: a sub-model of :class:`trnqwen.config.RunConfig` (flat name ``orpo_lambda``:
``--orpo-lambda``, ``TRNQWEN_ORPO_LAMBDA``, ``orpo_lambda`` in trnqwen.toml)."""

from __future__ import annotations

from trnqwen.methods.pair_settings import PairSettings
from trnqwen.settings import setting


class OrpoSettings(PairSettings):  # answer_end: every pair method's (methods/pair_settings.py)
    orpo_lambda: float = setting(
        0.1, gt=0.0, le=100.0, allow_inf_nan=False,
        help="ORPO: weight of the odds-ratio term beside the chosen answers' NLL (TRL's beta).", panel="Method",
    )
