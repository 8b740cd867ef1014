"""The ``[DPO]`` log lines, written by the ranks and read by inspect-logs (one home for both).

Each logged step of a DPO run is followed by::

    [DPO] step: 3  rewards/chosen: 0.012340  rewards/rejected: -0.004560  margin: 0.016900  accuracy: 0.7500  pairs: 8

and each validation by ``[DPO] validate step: 3  ...  loss: 0.690000  pairs: 12``; before step 1
the reference pass says what it did (``[DPO] reference log-probs: computed ...`` or ``reused``),
ending ``; beta 0.1, sigmoid loss`` when the ranks pass the settings (the judge's expected step-1 loss).
A separate line, not more columns on the step line: the step line stays torchtitan's (its fast
parsers and every other tool that reads it are unchanged), and a run without DPO has none.

The reading side, for ``inspect-logs`` (``Method.log_lines`` names this module): :data:`READERS`
say what each line is (:class:`~trnqwen.contract.method_lines.MethodLine`: a step's values, a
validation's, the ``reference`` note), and inspect-logs keeps them for the run; its per-step
columns are the method's metrics (``Method.metrics``).  On what it kept (``facts``, plain data:
see :mod:`trnqwen.methods.dpo.judge`) :func:`summary` gives ``--json``'s ``dpo`` key and
:func:`rows` the table's DPO rows; the judge's step-1 check is :mod:`trnqwen.methods.dpo.judge`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from trnqwen.contract.method_lines import LineReader, MethodLine
from trnqwen.output import number

MARK = "[DPO]"
FIELDS = ("rewards_chosen", "rewards_rejected", "margin", "accuracy")
_NUM = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf)"
LINE_RE = re.compile(
    r"\[DPO\] (?P<validate>validate )?step:\s*(?P<step>\d+)\s+rewards/chosen:\s*(?P<rewards_chosen>" + _NUM + r")"
    r"\s+rewards/rejected:\s*(?P<rewards_rejected>" + _NUM + r")\s+margin:\s*(?P<margin>" + _NUM + r")"
    r"\s+accuracy:\s*(?P<accuracy>" + _NUM + r")(?:\s+loss:\s*(?P<loss>" + _NUM + r"))?"
    r"(?:\s+pairs:\s*(?P<pairs>\d+))?"
)
REFERENCE_RE = re.compile(r"\[DPO\] reference log-probs: (?P<how>computed|reused)\b(?P<rest>.*)")
SETTINGS_RE = re.compile(r";\s*beta (?P<beta>" + _NUM + r"), (?P<loss_type>[a-z]+) loss\s*$")
# step-1 loss against the expected value: the log prints 5 decimals (float32 sums: ~1e-6 off)
STEP1_TOLERANCE = 1e-3


def format_line(step: int, metrics: dict[str, float], *, validate: bool = False) -> str:
    text = (
        f"{MARK} {'validate ' if validate else ''}step: {step}  rewards/chosen: {metrics['rewards_chosen']:.6f}  "
        f"rewards/rejected: {metrics['rewards_rejected']:.6f}  margin: {metrics['margin']:.6f}  "
        f"accuracy: {metrics['accuracy']:.4f}"
    )
    if validate:
        text += f"  loss: {metrics['loss']:.6f}"
    return text + f"  pairs: {int(metrics['pairs'])}"


def parse_line(line: str) -> Optional[tuple[bool, int, dict[str, float]]]:
    """(is validation, step, metrics) of a ``[DPO]`` step line, else None (``pairs`` an int)."""
    if MARK not in line:
        return None
    m = LINE_RE.search(line)
    if m is None:
        return None
    return bool(m.group("validate")), int(m.group("step")), _values(m)


def reference_line(how: str, detail: str, *, beta: Optional[float] = None, loss_type: Optional[str] = None) -> str:
    """``[DPO] reference log-probs: HOW DETAIL[; beta B, TYPE loss]`` (the settings: what the judge
    expects the step-1 loss to be from the log alone)."""
    text = f"{MARK} reference log-probs: {how} {detail}"
    if beta is not None and loss_type:
        text += f"; beta {beta:g}, {loss_type} loss"
    return text


# ---------------------------------------------------------------------------------------------
# reading: what each line says (inspect-logs keeps it: the primary rank's lines only)


def _values(m: "re.Match[str]") -> dict:
    values: dict = {name: float(m.group(name)) for name in FIELDS}
    if m.group("loss") is not None:
        values["loss"] = float(m.group("loss"))
    if m.group("pairs") is not None:
        values["pairs"] = int(m.group("pairs"))
    return values


def read_step(m: "re.Match[str]") -> MethodLine:
    """A ``[DPO] [validate ]step:`` line: a step's values (the last line of a step wins, as for the
    step table), or a validation's, joined to that step's validation record (``dpo_loss`` the
    line's loss; the record's loss too when the log has no validation line of its own)."""
    values = _values(m)
    step = int(m.group("step"))
    if not m.group("validate"):
        return MethodLine("step", values, step=step)
    loss = values.pop("loss", None)
    return MethodLine("validation", {**values, "dpo_loss": loss}, step=step, loss=loss)


def read_reference(m: "re.Match[str]") -> MethodLine:
    """``[DPO] reference log-probs: ...``: the ``reference`` note {how, detail, beta, loss_type}."""
    rest = m.group("rest").strip()
    settings = SETTINGS_RE.search(rest)
    return MethodLine("note", {
        "how": m.group("how"),
        "detail": (rest[: settings.start()] if settings else rest).strip(),
        "beta": float(settings.group("beta")) if settings else None,
        "loss_type": settings.group("loss_type") if settings else None,
    }, name="reference")


READERS = (
    LineReader("dpo", LINE_RE, read_step, (MARK,)),
    LineReader("dpo-reference", REFERENCE_RE, read_reference, (MARK,)),
)


def run_settings(run_config: Optional[dict]) -> Optional[dict]:
    """{beta, loss_type} from a run config (run.json's ``config``) of a DPO run, else None."""
    if not run_config or run_config.get("method") != "dpo":
        return None
    return {"beta": run_config.get("beta", 0.1), "loss_type": run_config.get("dpo_loss") or "sigmoid"}


def settings_of(reference: Optional[dict], run_config: Optional[dict]) -> tuple[Optional[float], Optional[str], Optional[str]]:
    """(beta, loss type, where from): the ``[DPO]`` reference line's, else the run config's, else unknown."""
    ref = reference or {}
    if ref.get("loss_type"):
        return ref.get("beta"), ref["loss_type"], "the [DPO] reference line"
    cfg = run_settings(run_config) or {}
    if cfg.get("loss_type"):
        return cfg.get("beta"), cfg["loss_type"], "the run config"
    return None, None, None


def expected_step1(beta: Optional[float], loss_type: Optional[str]) -> tuple[Optional[float], str]:
    """(the loss every pair has before the first update, how it is written)."""
    from trnqwen.methods.dpo.plan import initial_loss

    if loss_type == "ipo":
        if beta is None or not beta > 0:
            return None, "(1/(2 beta))^2"
        value = initial_loss("ipo", beta)
        return value, f"(1/(2 beta))^2 = {value:.6f} (ipo loss, beta {beta:g})"
    value = initial_loss("sigmoid", 0.1)
    return value, f"ln 2 = {value:.6f}"


# ---------------------------------------------------------------------------------------------
# on what inspect-logs kept (facts: plain data)


def _steps(facts: dict[str, Any]) -> dict[int, dict]:
    return (facts.get("lines") or {}).get("steps") or {}


def reference_note(facts: dict[str, Any]) -> Optional[dict]:
    """The ``[DPO] reference log-probs`` line's note ({how, detail, beta, loss_type, line}), if logged."""
    return ((facts.get("lines") or {}).get("notes") or {}).get("reference")


def is_run(facts: dict[str, Any]) -> bool:
    """A DPO run: its log has ``[DPO]`` lines, or its run config says ``method: dpo``."""
    return bool(_steps(facts) or reference_note(facts) or run_settings(facts.get("run_config")))


def settings(facts: dict[str, Any]) -> tuple[Optional[float], Optional[str], Optional[str]]:
    """(beta, loss type, where from): the reference line's, else the run config's, else unknown."""
    return settings_of(reference_note(facts), facts.get("run_config"))


def _last_validation(facts: dict[str, Any]) -> Optional[dict]:
    return next((v for v in reversed(facts.get("validations") or []) if "margin" in v), None)


def _rounded(rec: Optional[dict], keys: tuple) -> Optional[dict]:
    if rec is None:
        return None
    return {k: (None if isinstance(rec.get(k), float) and not math.isfinite(rec[k]) else rec.get(k)) for k in keys}


def summary(facts: dict[str, Any]) -> Optional[dict]:
    """``--json``'s ``dpo`` key (None for a run that is not DPO): the settings, the reference
    line, the expected step-1 loss, and the last step's and last validation's values."""
    if not is_run(facts):
        return None
    beta, loss_type, whence = settings(facts)
    expected, _ = expected_step1(beta, loss_type)
    steps, ref = _steps(facts), reference_note(facts)
    last = max(steps) if steps else None
    return {
        "beta": beta,
        "loss_type": loss_type,
        "settings_from": whence,
        "expected_step1_loss": expected,
        "reference": dict(ref) if ref else None,
        "steps_logged": len(steps),
        "last_step": _rounded({"step": last, **steps[last]}, ("step", *FIELDS, "pairs", "line")) if last else None,
        "last_validation": _rounded(_last_validation(facts), ("step", *FIELDS, "dpo_loss", "pairs", "line")),
    }


def _values_text(rec: dict) -> str:
    return (f"rewards chosen {number(rec.get('rewards_chosen'), '.4f')} / rejected {number(rec.get('rewards_rejected'), '.4f')}, "
            f"margin {number(rec.get('margin'), '.4f')}, accuracy {number(rec.get('accuracy'), '.2f')}")


def rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """The human table's DPO rows (none for a run that is not DPO)."""
    if not is_run(facts):
        return []
    beta, loss_type, _ = settings(facts)
    steps, ref = _steps(facts), reference_note(facts)
    out = []
    head = f"beta {beta:g}, {loss_type} loss" if beta is not None and loss_type else (loss_type or "settings not logged")
    out.append(("DPO", head + (f"; reference log-probs {ref['how']} {ref['detail']}" if ref else "; no reference line")))
    if steps:
        last = max(steps)
        out.append(("DPO last step", f"step {last}: {_values_text(steps[last])}"))
    val = _last_validation(facts)
    if val is not None:
        out.append(("DPO last validation", f"step {val['step']}: {_values_text(val)}"))
    return out
