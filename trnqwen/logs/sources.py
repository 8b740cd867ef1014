"""Where a log comes from and what else its run left behind.

* :func:`resolve_input` - a path, ``-`` (stdin) or a run directory -> :class:`LogInput`.
* :func:`run_context` - facts the judge needs that the log may not say: configured steps,
  vocab size and layer count (from ``run.json`` and the model's ``config.json``), fine-tune or not.
* :func:`read_structured_logs` / :func:`read_tensorboard` - torchtitan's per-rank JSONL trace
  records (``<dump_folder>/structured_logs/``) and TensorBoard scalars, used to confirm or fill in
  what the text log says.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.errors import UsageError
from trnqwen.rundir import LOG_NAME, RUN_RECORD, RunRecord

MAX_SIDECAR_FILES = 512
MAX_JSONL_BYTES = 256 << 20  # per structured-log file


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
    structured: dict = field(default_factory=dict)
    tensorboard: dict = field(default_factory=dict)
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
    from trnqwen.rundir import last_run_dir

    if arg is None:
        last = last_run_dir(Path(runs_dir)) if runs_dir is not None and Path(runs_dir).is_dir() else None
        if last is None:
            raise UsageError(
                f"no log given and no run found under {runs_dir}",
                hint="pass a log file or run directory (`trnqwen inspect-logs train.log`), "
                "or run `trnqwen train` first",
            )
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
            raise UsageError(
                f"{path / RUN_RECORD} is unreadable: {exc}", hint="pass the log file itself instead"
            ) from None
    log_path = None
    if record is not None and record.log_path:
        candidate = in_run_dir(record, path, record.log_path)
        if not candidate.exists() and record.status in ("created", "running") and record.ended_at is None:
            # still starting (data preparation, start-up): the launcher creates train.log when torchrun starts
            return LogInput(label=str(candidate), path=candidate, run_dir=path, record=record)
        if not candidate.is_file():
            raise UsageError(
                f"{label}: the run's log {candidate} is missing",
                hint="was the run directory copied without its train.log? pass the log file itself",
            )
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
                steps: Optional[int] = None, finetune: Optional[bool] = None, sidecars: bool = True) -> RunContext:
    """Gather what the judge needs; explicit arguments win over the run record."""
    ctx = RunContext()
    record = inp.record if inp is not None else None
    ctx.run_dir = inp.run_dir if inp is not None else None
    ctx.record = record
    cfg: dict[str, Any] = dict(record.config) if record is not None and isinstance(record.config, dict) else {}
    extra: dict[str, Any] = dict(record.extra) if record is not None and isinstance(record.extra, dict) else {}
    if record is not None:
        ctx.status = record.status
        ctx.ended = record.status not in ("created", "running") or record.ended_at is not None
    ctx.configured_steps = _first((steps, "flag"), (record.steps if record else None, "run.json"), (cfg.get("steps"), "run config"))[0]
    # fine-tune?
    if finetune is not None:
        ctx.finetune = finetune
    elif "finetune" in cfg:
        ctx.finetune = bool(cfg.get("finetune"))
    # model config.json
    model_cfg, model_cfg_path = _model_config(record, cfg, ctx.run_dir)
    ctx.model_config = model_cfg
    if model_cfg_path is not None:
        from trnqwen.assets import declares_random_init

        ctx.base_random_init = declares_random_init(model_cfg_path.parent)
    if cfg.get("lora"):
        ctx.lora = _lora_settings(cfg)
    ctx.run_config = cfg or None
    found = str(model_cfg_path)  # explicit facts first, then run.json's, then the base model's config.json
    ctx.vocab_size, ctx.vocab_source = _first((vocab_size, "--vocab-size"), (extra.get("vocab_size"), "run.json"),
                                              (_cfg_get(model_cfg or {}, "vocab_size"), found))
    ctx.num_layers, ctx.layers_source = _first(
        (expect_layers, "--expect-layers"), (extra.get("num_layers"), "run.json"),
        (cfg.get("moe_layers") if cfg.get("backend") == "nki-moe" else None, "run config moe_layers"),
        (_cfg_get(model_cfg or {}, "num_hidden_layers"), found))
    if sidecars and ctx.run_dir is not None:
        roots = [ctx.run_dir]
        dump = extra.get("dump_folder") or cfg.get("dump_folder")
        if isinstance(dump, str) and dump:
            d = Path(dump)
            roots.append(d if d.is_absolute() else ctx.run_dir / d)
        ctx.structured = read_structured_logs(roots)
        ctx.tensorboard = read_tensorboard(roots)
        ctx.evaluation = read_evaluation(ctx.run_dir)
        if ctx.lora is not None and isinstance(extra.get("rank_log_dir"), str):
            from trnqwen.logs.lora import read_rank_logs

            ctx.rank_lora = read_rank_logs(in_run_dir(record, ctx.run_dir, extra["rank_log_dir"]))
    return ctx


def _lora_settings(cfg: dict) -> dict:
    """What the run config says the adapter is (as trnqwen.train.lora.spec_from_config reads it)."""
    from trnqwen.constants import LORA_ALL_LINEAR
    from trnqwen.contract.lora import targets_of

    rank = cfg.get("lora_rank")
    alpha = cfg.get("lora_alpha")
    if alpha is None and _pos_int(rank):
        alpha = 2.0 * int(rank)
    targets = cfg.get("lora_targets") or LORA_ALL_LINEAR
    return {"rank": int(rank) if _pos_int(rank) else None, "alpha": alpha,
            "targets": list(targets_of(str(targets))), "backend": cfg.get("backend")}


def read_evaluation(run_dir: Path) -> dict:
    """``trnqwen eval``'s results for this run (``eval.json``), {} when it was never evaluated."""
    try:
        data = json.loads((Path(run_dir) / "eval.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("results"), list) else {}


def _first(*candidates: tuple[Any, str]) -> tuple[Optional[int], Optional[str]]:
    """The first positive whole number of the (value, where it came from) pairs, with its source."""
    return next(((int(v), src) for v, src in candidates if _pos_int(v)), (None, None))


def _pos_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _cfg_get(cfg: dict, key: str) -> Any:
    if key in cfg:
        return cfg[key]
    text = cfg.get("text_config")
    return text.get(key) if isinstance(text, dict) else None


def _model_config(record: Optional[RunRecord], cfg: dict, run_dir: Optional[Path]) -> tuple[Optional[dict], Optional[Path]]:
    candidates = []
    for value in (record.assets_dir if record is not None else None, cfg.get("assets_dir")):
        if value:
            candidates.append(in_run_dir(record, run_dir, str(value)) if record is not None and run_dir is not None else Path(str(value)))
    for base in candidates:
        if not base.is_absolute() and run_dir is not None and not base.exists():
            base = run_dir / base
        path = base / "config.json"
        try:
            if path.is_file() and path.stat().st_size < (4 << 20):
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict):
                    return data, path
        except (OSError, ValueError):
            continue
    return None, None


# ---------------------------------------------------------------------------------------------
# torchtitan's structured JSONL logs


_RANK_FILE_RE = re.compile(r"\.global_rank_(\d+)\.")


def _find(roots: list[Path], pattern: str, max_depth: int = 4) -> list[Path]:
    found: list[Path] = []
    seen: set = set()
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            depth = len(Path(dirpath).relative_to(root).parts)
            if depth >= max_depth:
                dirnames[:] = []
            # never wander into checkpoints (large, many files)
            dirnames[:] = [d for d in dirnames if not d.startswith(("step-", "checkpoint", "sharded"))]
            for name in filenames:
                if re.fullmatch(pattern, name):
                    p = Path(dirpath) / name
                    key = p.resolve()
                    if key not in seen:
                        seen.add(key)
                        found.append(p)
                        if len(found) >= MAX_SIDECAR_FILES:
                            return found
    return found


def read_structured_logs(roots: list[Path]) -> dict:
    """Summarise ``structured_logs/*.global_rank_N.*.jsonl``: ranks, steps each rank finished,
    step durations (rank 0) and ``*_error`` records.  Empty dict when there are none."""
    files = [p for p in _find(roots, r".+\.global_rank_\d+\..+\.jsonl") if p.parent.name == "structured_logs"]
    if not files:
        return {}
    ranks: dict[int, dict] = {}
    step_ms: dict[int, float] = {}
    errors: list[dict] = []
    bad_lines = 0
    for path in files:
        m = _RANK_FILE_RE.search(path.name)
        rank = int(m.group(1)) if m else -1
        info = ranks.setdefault(rank, {"last_step": None, "steps_done": 0, "files": 0})
        info["files"] += 1
        try:
            with open(path, "rb") as fh:
                budget = MAX_JSONL_BYTES
                for raw in fh:
                    budget -= len(raw)
                    if budget < 0:
                        break
                    if b"_end" not in raw and b"_error" not in raw:
                        continue
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        bad_lines += 1
                        continue
                    if not isinstance(rec, dict):
                        continue
                    name = str(rec.get("log_type_name") or "")
                    step = rec.get("step")
                    if name == "step_end" and isinstance(step, int):
                        info["steps_done"] += 1
                        if info["last_step"] is None or step > info["last_step"]:
                            info["last_step"] = step
                        value = rec.get("value")
                        if rank == 0 and isinstance(value, (int, float)) and math.isfinite(value):
                            step_ms[step] = float(value)
                    elif name.endswith("_error") and len(errors) < 50:
                        errors.append({"rank": rank, "event": name[: -len("_error")], "step": step,
                                       "message": str(rec.get("message") or "")[:500], "file": str(path)})
        except OSError:
            continue
    return {
        "files": len(files),
        "ranks": {r: v for r, v in sorted(ranks.items())},
        "world_size": len([r for r in ranks if r >= 0]) or None,
        "step_ms": step_ms,
        "errors": errors,
        "bad_lines": bad_lines,
    }


# ---------------------------------------------------------------------------------------------
# TensorBoard

TB_TAGS = {
    "loss_metrics/global_avg_loss": "loss",
    "grad_norm": "grad_norm",
    "throughput(tps)": "tps",
    "tflops": "tflops",
    "mfu(%)": "mfu",
    "memory/max_reserved(GiB)": "memory_gib",
    "memory/max_reserved(%)": "memory_pct",
}


def read_tensorboard(roots: list[Path]) -> dict:
    """Step metrics from TensorBoard event files torchtitan wrote (``metrics.enable_tensorboard``):
    ``{"files": n, "steps": {step: {field: value}}}``; empty when none or tensorboard is missing."""
    files = _find(roots, r"events\.out\.tfevents\..+", max_depth=5)
    if not files:
        return {}
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except Exception:  # tensorboard not installed: nothing to confirm with
        return {"files": len(files), "steps": {}, "error": "tensorboard is not installed"}
    steps: dict[int, dict] = {}
    errors = []
    # rank 0's (or the only) writer: torchtitan writes one dir, or rank_N dirs with save_for_all_ranks
    files.sort(key=lambda p: (0 if "rank_0" in str(p) or "rank_" not in str(p) else 1, str(p)))
    for path in files:
        if "rank_" in str(path) and "rank_0" not in str(path) and steps:
            continue
        try:
            acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
            acc.Reload()
            tags = acc.Tags().get("scalars", [])
            for tag in tags:
                key = TB_TAGS.get(tag)
                if key is None and "/" in tag:  # a run tag in front: "<tag>/<metric>"
                    key = TB_TAGS.get(tag.split("/", 1)[1])
                if key is None:
                    continue
                for ev in acc.Scalars(tag):
                    steps.setdefault(int(ev.step), {})[key] = float(ev.value)
        except Exception as exc:  # a corrupt or half-written event file
            errors.append(f"{path}: {type(exc).__name__}: {exc}"[:300])
    out: dict = {"files": len(files), "steps": steps}
    if errors:
        out["error"] = "; ".join(errors[:3])
    return out


def fill_from_tensorboard(log, tb: dict) -> list[int]:
    """Add the steps TensorBoard has and the text log lacks (``"line": None``,
    ``"source": "tensorboard"``); returns them (also kept in ``log.filled_steps``)."""
    from trnqwen.contract.stepline import STEP_FIELDS

    filled = []
    recs: list[dict] = []
    for step, values in sorted((tb or {}).get("steps", {}).items()):
        if step in log.steps or "loss" not in values:
            continue
        rec = {name: values.get(name) for name in STEP_FIELDS}
        rec["step"] = step
        if isinstance(rec.get("tps"), float) and rec["tps"].is_integer():
            rec["tps"] = int(rec["tps"])
        rec["line"] = None
        rec["source"] = "tensorboard"
        recs.append(rec)
        filled.append(step)
    if recs:
        log.steps.add_filled(recs)
    log.filled_steps = filled
    return filled
