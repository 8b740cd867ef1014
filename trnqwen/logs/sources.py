"""Where a log comes from and what else its run left behind.

* :func:`resolve_input` - a path, ``-`` (stdin) or a run directory -> :class:`LogInput`.
* :func:`run_context` - facts the judge needs that the log may not say: configured steps,
  vocab size and layer count (from ``run.json`` and the model's ``config.json``), fine-tune or not.

trnqwen's own runs keep their steps in the metrics stream (:mod:`trnqwen.logs.stream`), so the
other structured files a run may leave (TensorBoard events, torchtitan's ``structured_logs``) are
not read: they would be a second copy of what the stream and the text log already say.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.adapters.lora.readers import configured, read_rank_logs
from trnqwen.assets import CONFIG_NAME, declares_random_init, read_config_json
from trnqwen.errors import UsageError
from trnqwen.rundir import LOG_NAME, RUN_RECORD, RunRecord, last_run_dir


@dataclass
class LogInput:
    """One log to read: a file path, or stdin (``path`` None); ``run_dir`` when it is a run's."""

    label: str
    path: Optional[Path] = None
    run_dir: Optional[Path] = None
    record: Optional[RunRecord] = None

    @property
    def is_stdin(self) -> bool:
        return self.path is None


@dataclass
class RunContext:
    """What is known about the run besides its log."""

    run_dir: Optional[Path] = None
    record: Optional[RunRecord] = None
    configured_steps: Optional[int] = None
    vocab_size: Optional[int] = None
    vocab_source: Optional[str] = None
    num_layers: Optional[int] = None
    layers_source: Optional[str] = None
    finetune: Optional[bool] = None
    status: Optional[str] = None
    ended: bool = False
    identity: Any = None  # trnqwen.logs.identity.ModelIdentity, once the log was read
    evaluation: dict = field(default_factory=dict)  # <run dir>/eval.json (trnqwen eval), when present
    # the run config's LoRA settings when it trained one: {rank, alpha, targets, backend}; None: not LoRA / unknown
    lora: Optional[dict] = None
    model_config: Optional[dict] = None  # the base model's config.json, when found
    # the base model's card says its weights are random by design (builtin:tiny-qwen3): a fine-tune
    # of it starts at random-init loss, and that is no sign of unloaded weights
    base_random_init: bool = False
    rank_lora: dict = field(default_factory=dict)  # rank -> its [LoRA] line from the run's per-rank logs
    run_config: Optional[dict] = None  # the run's config (run.json) when known: a method's rules read its settings there


def resolve_input(arg: Optional[str], runs_dir: Optional[Path] = None) -> LogInput:
    """``-`` is stdin; a directory is a run dir (run.json + train.log) or holds train.log; None
    is the last run under ``runs_dir``."""
    if arg is None:
        last = last_run_dir(Path(runs_dir)) if runs_dir is not None and Path(runs_dir).is_dir() else None
        if last is None:
            raise UsageError(f"no log given and no run found under {runs_dir}",
                             hint="pass a log file or run directory (`trnqwen inspect-logs train.log`), or run `trnqwen train` first")
        last = last.absolute()  # found, not typed: report where it is, whatever the working folder
        return _from_dir(last, str(last))
    if arg == "-":
        return LogInput(label="<stdin>")
    path = Path(arg).expanduser()
    if path.is_dir():
        return _from_dir(path, arg)
    if not path.exists() and path.is_symlink():
        raise UsageError(f"{arg} is a broken symbolic link or a symlink loop", hint="pass the log file itself")
    if not path.exists():
        raise UsageError(f"no such log file or run directory: {arg}", hint="check the path")
    if not (path.is_file() or path.is_fifo() or path.is_char_device()):
        raise UsageError(f"{arg} is not a regular file", hint="pass a log file, a run directory or - for stdin")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {arg} (permission denied)", hint="check the file's permissions")
    return LogInput(label=arg, path=path)


def _from_dir(path: Path, label: str) -> LogInput:
    record = None
    if (path / RUN_RECORD).is_file():
        try:
            record = RunRecord.load(path)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"{path / RUN_RECORD} is unreadable: {exc}", hint="pass the log file itself instead") from None
    log_path = None
    if record is not None and record.log_path:
        candidate = in_run_dir(record, path, record.log_path)
        if not candidate.exists() and record.status in ("created", "running") and record.ended_at is None:
            # still starting (data preparation, start-up): the launcher creates train.log when torchrun starts
            return LogInput(label=str(candidate), path=candidate, run_dir=path, record=record)
        if not candidate.is_file():
            raise UsageError(f"{label}: the run's log {candidate} is missing",
                             hint="was the run directory copied without its train.log? pass the log file itself")
        log_path = candidate
    if log_path is None and (path / LOG_NAME).is_file():
        log_path = path / LOG_NAME
    if log_path is None:
        what = "a run directory without a train.log" if record is not None else "a directory with no run.json or train.log"
        raise UsageError(f"{label} is {what}", hint="pass the log file itself, or a run directory made by `trnqwen train`")
    return LogInput(label=str(log_path), path=log_path, run_dir=path, record=record)


def in_run_dir(record: RunRecord, run_dir: Path, value: str) -> Path:
    """A path from run.json as it is in *this* run directory: relative paths are relative to it,
    and a path under the directory the run was made in is re-rooted here (a copied or moved run
    directory never reads the original's files).  A path outside the run directory stays."""
    p = Path(value)
    if not p.is_absolute():
        return run_dir / p
    if record.run_dir:
        try:
            return run_dir / p.relative_to(Path(record.run_dir))
        except ValueError:
            pass
    return p


# ---------------------------------------------------------------------------------------------
# run facts


def run_context(inp: Optional[LogInput], *, expect_layers: Optional[int] = None, vocab_size: Optional[int] = None,
                steps: Optional[int] = None, finetune: Optional[bool] = None) -> RunContext:
    """Gather what the judge needs; explicit arguments win over the run record."""
    record = inp.record if inp is not None else None
    ctx = RunContext(run_dir=inp.run_dir if inp is not None else None, record=record)
    cfg: dict[str, Any] = dict(record.config) if record is not None and isinstance(record.config, dict) else {}
    extra: dict[str, Any] = dict(record.extra) if record is not None and isinstance(record.extra, dict) else {}
    if record is not None:
        ctx.status = record.status
        ctx.ended = record.status not in ("created", "running") or record.ended_at is not None
    ctx.configured_steps = _first((steps, "flag"), (record.steps if record else None, "run.json"), (cfg.get("steps"), "run config"))[0]
    ctx.finetune = finetune if finetune is not None else bool(cfg["finetune"]) if "finetune" in cfg else None
    # model config.json
    model_cfg, model_cfg_path = _model_config(record, cfg, ctx.run_dir)
    ctx.model_config, ctx.lora, ctx.run_config = model_cfg, configured(cfg) if cfg.get("lora") else None, cfg or None
    ctx.base_random_init = model_cfg_path is not None and declares_random_init(model_cfg_path.parent)
    found = str(model_cfg_path)  # explicit facts first, then run.json's, then the base model's config.json
    ctx.vocab_size, ctx.vocab_source = _first((vocab_size, "--vocab-size"), (extra.get("vocab_size"), "run.json"),
                                              (_cfg_get(model_cfg or {}, "vocab_size"), found))
    ctx.num_layers, ctx.layers_source = _first(
        (expect_layers, "--expect-layers"), (extra.get("num_layers"), "run.json"),
        (cfg.get("moe_layers") if cfg.get("backend") == "nki-moe" else None, "run config moe_layers"),
        (_cfg_get(model_cfg or {}, "num_hidden_layers"), found))
    if ctx.run_dir is not None:
        ctx.evaluation = read_evaluation(ctx.run_dir)
        if ctx.lora is not None and isinstance(extra.get("rank_log_dir"), str):
            ctx.rank_lora = read_rank_logs(in_run_dir(record, ctx.run_dir, extra["rank_log_dir"]))
    return ctx


def read_evaluation(run_dir: Path) -> dict:
    """``trnqwen eval``'s results for this run (``eval.json``), {} when it was never evaluated."""
    try:
        data = json.loads((Path(run_dir) / "eval.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("results"), list) else {}


def _first(*candidates: tuple[Any, str]) -> tuple[Optional[int], Optional[str]]:
    """The first positive whole number of the (value, where it came from) pairs, with its source."""
    return next(((v, src) for v, src in candidates if isinstance(v, int) and not isinstance(v, bool) and v > 0), (None, None))


def _cfg_get(cfg: dict, key: str) -> Any:
    if key in cfg:
        return cfg[key]
    text = cfg.get("text_config")
    return text.get(key) if isinstance(text, dict) else None


def _model_config(record: Optional[RunRecord], cfg: dict, run_dir: Optional[Path]) -> tuple[Optional[dict], Optional[Path]]:
    """The base model's config.json (run.json's assets folder, else the run config's), and its path."""
    for value in (record.assets_dir if record is not None else None, cfg.get("assets_dir")):
        if not value:
            continue
        base = in_run_dir(record, run_dir, str(value)) if record is not None and run_dir is not None else Path(str(value))
        if not base.is_absolute() and run_dir is not None and not base.exists():
            base = run_dir / base
        data = read_config_json(base)
        if data is not None:
            return data, base / CONFIG_NAME
    return None, None
