"""The run setting every preference-pair method shares (DPO, ORPO): which tokens end a trained answer.

Declared once, here; each pair method's settings model inherits it (``methods/<name>/settings.py``),
so RunConfig has it as one flat field (``--answer-end``, ``TRNQWEN_ANSWER_END``, ``answer_end`` in
trnqwen.toml).  The data pipeline reads it (``dataset/preference.py``): a chat run ignores it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trnqwen.settings import setting

ANSWER_ENDS = ("im_end", "trl")
AnswerEnd = Literal["im_end", "trl"]


class PairSettings(BaseModel):
    answer_end: AnswerEnd = setting(
        "im_end", panel="Method",
        help="Preference pairs: where a trained answer ends: im_end (the answer and its <|im_end|>, as SFT trains "
        "it) or trl (also the newline the chat template writes after <|im_end|>, as TRL's DPOTrainer trains it: "
        "to compare like with like).",
    )
