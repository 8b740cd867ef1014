"""The ``[LoRA]`` line in inspect-logs and its judge: did the run train only its adapters?

inspect-logs imports these readers (``logs/`` sits above ``adapters/``); they read the parsed log
and the run's context through :class:`LoraLog` and :class:`LoraContext`, what ``logs.record.ParsedLog``
and ``logs.sources.RunContext`` hold, so this module imports nothing of ``logs/``.

Every rank of a LoRA run logs one line before step 1 (:func:`trnqwen.contract.lora.log_line`,
read back by :func:`~trnqwen.contract.lora.read_log_line` into ``ParsedLog.lora``).  The judge reads it back:

* error ``lora-not-adapters``: the trainable count is not the adapters' (the whole model trains,
  no adapter was built, it differs from ``r x (in + out)`` summed over the adapted projections of
  the base in config.json, or not every adapter was initialised);
* error ``lora-ranks-disagree``: two ranks report different counts or settings;
* error ``lora-config-mismatch``: the line's rank or targets are not the run config's;
* warning ``lora-line-missing``: the run config says LoRA but no ``[LoRA]`` line was logged;
* info ``lora``: the line, when all is well.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Protocol

from trnqwen.constants import LORA_ALL_LINEAR
from trnqwen.contract.lora import LOG_MARK, read_log_line, targets_of


class LoraLog(Protocol):
    """What the readers ask of a parsed log (``trnqwen.logs.record.ParsedLog``)."""

    primary_rank: Optional[int]
    lora: dict[Optional[int], dict]  # process rank (None: unprefixed) -> its [LoRA] line read back


class LoraContext(Protocol):
    """What they ask of the run's context (``trnqwen.logs.sources.RunContext``)."""

    lora: Optional[dict]  # the run config's adapter (:func:`configured`); None: not a LoRA run
    rank_lora: dict  # rank -> its [LoRA] line from the run's per-rank logs (:func:`read_rank_logs`)
    model_config: Optional[dict]  # the base's config.json

_SETTINGS = ("trainable", "total", "rank", "alpha", "dropout", "adapters", "targets", "initialised")
RANK_FILE_BYTES = 16 << 20  # the line comes before step 1: the head of each per-rank log is enough
_NEEDLE = f"{LOG_MARK} trainable".encode()


def configured(run_config: dict) -> dict:
    """What the run config says the adapter is (as :func:`trnqwen.adapters.lora.plan.spec_from_config`
    reads it): {rank, alpha, targets, backend}."""
    rank = run_config.get("lora_rank")
    ranked = isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
    alpha = run_config.get("lora_alpha")
    if alpha is None and ranked:
        alpha = 2.0 * int(rank)
    targets = run_config.get("lora_targets") or LORA_ALL_LINEAR
    return {"rank": int(rank) if ranked else None, "alpha": alpha,
            "targets": list(targets_of(str(targets))), "backend": run_config.get("backend")}


def read_rank_logs(rank_log_dir: Optional[Path]) -> dict[int, dict]:
    """Every rank's ``[LoRA]`` line from torchrun's tee'd per-rank logs (``.../attempt_N/<r>/std*.log``):
    the run's train.log holds only rank 0's output, the judge compares them all.  The last attempt wins."""
    if rank_log_dir is None or not Path(rank_log_dir).is_dir():
        return {}

    def attempt(p: Path) -> int:
        m = re.fullmatch(r"attempt_(\d+)", p.parent.parent.name)
        return int(m.group(1)) if m else -1

    found: dict[int, dict] = {}
    for path in sorted(Path(rank_log_dir).glob("**/attempt_*/*/std*.log"), key=attempt)[:4096]:
        try:
            with open(path, "rb") as fh:
                head = fh.read(RANK_FILE_BYTES)
        except OSError:
            continue
        at = head.find(_NEEDLE)
        while at >= 0:
            end = head.find(b"\n", at)
            got = read_log_line(head[at: end if end >= 0 else len(head)].decode("utf-8", "replace").rstrip("\r"))
            if got is not None and got[0] is not None:
                found[got[0]] = {**got[1], "line": None, "file": str(path)}
            at = head.find(_NEEDLE, at + 1)
    return found


def per_rank(log: LoraLog, ctx: LoraContext) -> dict:
    """The ranks' ``[LoRA]`` records: the per-rank logs of the run, then the log's own lines."""
    return {**(ctx.rank_lora or {}), **log.lora}


def primary_line(log: LoraLog) -> Optional[dict]:
    """The primary rank's ``[LoRA]`` record (else the lowest rank's, the unprefixed stream first)."""
    if log.primary_rank in log.lora:
        return log.lora[log.primary_rank]
    return log.lora.get(min(log.lora, key=lambda r: -1 if r is None else r, default=None))


def expected_trainable(rec: dict, ctx: LoraContext) -> Optional[int]:
    """Adapter parameters the base's config.json implies for the line's rank and targets (None when
    the config is unknown, or the model was cut by the recipe: nki-moe)."""
    cfg = ctx.model_config
    backend = (ctx.lora or {}).get("backend")
    if not cfg or backend == "nki-moe" or cfg.get("model_type") not in ("qwen3", "qwen3_moe"):
        return None
    from trnqwen.titan_compat import dims_from_hf_config
    from trnqwen.contract.lora import adapter_params

    try:
        dims = dims_from_hf_config(cfg)
    except (KeyError, TypeError, ValueError):
        return None
    return adapter_params(dims, SimpleNamespace(rank=rec["rank"]), tuple(rec["targets"]))


def lora_json(log: LoraLog, ctx: LoraContext) -> Optional[dict]:
    """``--json``'s ``lora`` key: the primary rank's line, the ranks that logged one, the expected
    trainable count and the run config's settings; None for a run that is not LoRA."""
    rec = primary_line(log)
    if rec is None:
        return {"logged": False, "configured": ctx.lora} if ctx.lora else None
    return {
        "logged": True,
        **{k: rec[k] for k in (*_SETTINGS, "percent", "line")},
        "ranks": sorted(r for r in per_rank(log, ctx) if r is not None),
        "expected_trainable": expected_trainable(rec, ctx),
        "configured": ctx.lora,
    }


def check_lora(log: LoraLog, ctx: LoraContext) -> list[tuple]:
    """(severity, code, message[, lines]) of every LoRA finding (:mod:`trnqwen.logs.judge` makes them
    its ``Finding``; it imports this module)."""
    rec = primary_line(log)
    if rec is None:
        if ctx.lora:
            return [("warning", "lora-line-missing",
                    "the run config says LoRA, but no [LoRA] line was logged: nothing shows that only the "
                    "adapters trained (a backend that does not log it, or a run that stopped before step 1)")]
        return []
    out: list[tuple] = []
    ranks = per_rank(log, ctx)
    lines = [r["line"] for r in ranks.values() if r.get("line") is not None]
    wrong: list[str] = []
    if rec["trainable"] >= rec["total"]:
        wrong.append(f"every parameter is trainable ({rec['trainable']:,} of {rec['total']:,}): the base is not frozen")
    if rec["adapters"] == 0:
        wrong.append("no adapter was built")
    if rec["initialised"] != rec["adapters"]:
        wrong.append(f"{rec['initialised']} of {rec['adapters']} adapters were initialised")
    expected = expected_trainable(rec, ctx)
    if expected is not None and rec["trainable"] != expected and not wrong:
        wrong.append(f"{rec['trainable']:,} trainable, but rank {rec['rank']} adapters on {','.join(rec['targets'])} "
                     f"of this base have {expected:,} parameters")
    if wrong:
        out.append(("error", "lora-not-adapters", "LoRA: the trainable parameters are not the adapters': "
                    + "; ".join(wrong), [rec["line"]]))
    differ = _differ(ranks)
    if differ:
        out.append(("error", "lora-ranks-disagree", f"LoRA: ranks disagree on {differ}", lines[:8]))
    cfg = ctx.lora or {}
    mismatch = []
    if cfg.get("rank") is not None and cfg["rank"] != rec["rank"]:
        mismatch.append(f"rank {rec['rank']} logged, {cfg['rank']} configured")
    if cfg.get("targets") and cfg.get("backend") != "nki-moe" and cfg["targets"] != rec["targets"]:
        mismatch.append(f"targets {','.join(rec['targets'])} logged, {','.join(cfg['targets'])} configured")
    if mismatch:
        out.append(("error", "lora-config-mismatch", "LoRA: the log is not the run config's adapter: "
                    + "; ".join(mismatch), [rec["line"]]))
    if not out:
        check = ", as config.json's shapes give" if expected is not None else ""
        out.append(("info", "lora", f"LoRA: {rec['trainable']:,} trainable of {rec['total']:,} parameters "
                    f"({rec['percent']:.2f}%){check}: {rec['adapters']} adapters, rank {rec['rank']}, "
                    f"{len(ranks)} rank(s) logged it", [rec["line"]]))
    return out


def _differ(per_rank: dict[Optional[int], dict]) -> Optional[str]:
    if len(per_rank) < 2:
        return None
    keys = [k for k in _SETTINGS if len({repr(rec[k]) for rec in per_rank.values()}) > 1]
    if not keys:
        return None
    shown = "; ".join(f"rank {r}: " + ", ".join(f"{k} {per_rank[r][k]}" for k in keys)
                      for r in sorted(per_rank, key=lambda r: -1 if r is None else r)[:4])
    return f"{', '.join(keys)} ({shown})"


def lora_row(log: LoraLog, ctx: LoraContext) -> Optional[str]:
    """The human table's ``LoRA`` row."""
    rec = primary_line(log)
    if rec is None:
        return None
    return (f"trainable {rec['trainable']:,} of {rec['total']:,} ({rec['percent']:.2f}%), rank {rec['rank']}, "
            f"alpha {rec['alpha']:g}, {rec['adapters']} adapters on {','.join(rec['targets'])}; "
            f"{len(per_rank(log, ctx))} rank(s) logged it")
