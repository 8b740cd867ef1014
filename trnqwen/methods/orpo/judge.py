"""The judge's rules about an ORPO run (``Method.judge``), on plain data.

``facts`` (built by the judge for every method, see :mod:`trnqwen.methods.dpo.judge` for the
fields): ``first_step`` (``{"step", "loss", "line"}``), ``start_step``, ``lines`` and
``run_config`` (run.json's config, which names the method).

ORPO's loss is the chosen answers' NLL plus lambda x -log sigmoid(log odds): both parts are
positive, so a step-1 loss that is not a finite number above 0 means the loss did not see its
pairs (error ``orpo-step1-invalid``).  There is no ln 2 rule (no reference: step 1 is not a known
value), and no ln(vocab) rule (``Method.token_loss`` is False: the odds-ratio term rides on the
token loss).  Only step 1, and only when the log starts there.
"""

from __future__ import annotations

import math
from typing import Any


def is_run(facts: dict[str, Any]) -> bool:
    return ((facts.get("run_config") or {}).get("method")) == "orpo"


def rules(facts: dict[str, Any]) -> list[tuple]:
    """(severity, code, message, lines): the step-1 loss of an ORPO run."""
    first = facts.get("first_step")
    if not is_run(facts) or not first or first["step"] != 1 or facts.get("start_step") not in (None, 1):
        return []
    loss = first["loss"]
    lam = (facts.get("run_config") or {}).get("orpo_lambda")
    if not isinstance(loss, (int, float)) or not math.isfinite(loss) or loss <= 0:
        return [("error", "orpo-step1-invalid",
                 f"step-1 ORPO loss {loss}: expected a finite number above 0 (the chosen answers' NLL plus lambda x "
                 "-log sigmoid(log odds)); the loss did not see its pairs", [first["line"]])]
    return [("info", "orpo-step1", f"step-1 ORPO loss {loss:.6f} (the chosen answers' NLL + lambda x the odds-ratio "
             f"term{f', lambda {lam:g}' if isinstance(lam, (int, float)) else ''}; reference-free)", [first["line"]])]
