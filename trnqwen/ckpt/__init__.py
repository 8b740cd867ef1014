"""Checkpoint verification (``trnqwen verify-ckpt``): public entry points.

    from trnqwen.ckpt import locate, verify
    ckpt, model_config = locate(Path("checkpoint_qwen3_4b_ft"), run_config=cfg)
    report = verify(ckpt, model_config)          # VerifyReport; report.ok, report.to_json()

Modules: ``layout`` (which files, which config.json), ``spec`` (expected tensors of a Qwen3
config; the meta-device round trip), ``scan`` (streaming NaN/Inf counts and relative change), ``generate`` (``--generate``), ``verify`` (orchestration),
``verify_adapter`` (a PEFT LoRA adapter folder against its base).
Headers come from :mod:`trnqwen.safetensors_format` (shared with fetch and preflight).
No module imports torch or numpy at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trnqwen.ckpt.layout import CheckpointFiles, ModelConfig, find_config, resolve_checkpoint
from trnqwen.ckpt.verify import VerifyReport, verify
from trnqwen.errors import UsageError

__all__ = ["CheckpointFiles", "ModelConfig", "VerifyReport", "locate", "resolve_checkpoint", "find_config", "verify"]


def locate(
    checkpoint: Optional[Path],
    *,
    step: Optional[int] = None,
    assets: Optional[Path] = None,
    run_config=None,
    base: Optional[Path] = None,
) -> tuple[CheckpointFiles, ModelConfig]:
    """CHECKPOINT (or the last run's checkpoint when None) and the config.json to build from.

    ``run_config`` is the resolved :class:`trnqwen.config.RunConfig` (runs_dir, assets_dir).  For a
    PEFT adapter folder the config is its base model's (:func:`trnqwen.ckpt.verify_adapter.find_base_config`;
    ``base`` is ``--base``).
    """
    run_assets: Optional[Path] = None
    note = None
    if checkpoint is None:
        checkpoint, run_assets, note = _last_run_checkpoint(run_config)
    else:
        run_assets = _assets_of_run_that_wrote(Path(checkpoint), run_config)
    ckpt = resolve_checkpoint(checkpoint, step)
    ckpt.note = note
    config_assets = Path(run_config.resolved_assets_dir) if run_config is not None else None
    from trnqwen.ckpt.verify_adapter import find_base_config, is_adapter

    if is_adapter(ckpt):
        return ckpt, find_base_config(ckpt, base=base, assets=assets, run_assets=run_assets, config_assets=config_assets)
    if base is not None:
        raise UsageError(
            f"--base applies to a LoRA adapter folder, and {ckpt.root} is a whole model",
            hint="use --assets DIR to name the config.json a whole-model checkpoint is built from",
        )
    model_config = find_config(ckpt, assets=assets, run_assets=run_assets, config_assets=config_assets)
    return ckpt, model_config


def _how_it_stands(record) -> str:
    """``is still running``, ``was interrupted at step 4 (resume it: ...)``, ``ended failed: <cause>``."""
    if record.status in ("created", "running"):
        return "is still running"
    step = record.extra.get("interrupted_at_step")
    if step:
        return f"was interrupted at step {step} (resume it: {record.extra.get('resume_command')})"
    return f"ended {record.status}" + (f": {record.error}" if record.error else "")


def _last_run_checkpoint(run_config) -> tuple[Path, Optional[Path], Optional[str]]:
    """The last run's export when that run succeeded; else the newest succeeded run's, saying so.

    A failed run must never pass verification on an older run's export without a word.
    """
    from trnqwen.rundir import RunRecord, last_run_dir

    runs_dir = Path(run_config.runs_dir) if run_config is not None else Path(".trnqwen/runs")
    run_dir = last_run_dir(runs_dir) if runs_dir.is_dir() else None
    if run_dir is None:
        raise UsageError(
            f"no CHECKPOINT given and no previous run under {runs_dir}",
            hint="pass the checkpoint folder, e.g. trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft",
        )
    try:
        record = RunRecord.load(run_dir)
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read the last run's record in {run_dir}: {exc}", hint="pass the checkpoint folder") from None
    note = None
    if record.status != "succeeded":
        how = _how_it_stands(record)
        earlier = _newest_succeeded_export(runs_dir, exclude=record.run_id)
        if earlier is None:
            raise UsageError(
                f"the last run ({record.run_id}) {how}, and no earlier run exported a checkpoint to check instead",
                hint="pass the checkpoint folder explicitly, or "
                + ("wait until that run has finished" if record.status in ("created", "running") else "finish that run first"),
            )
        other, path = earlier
        note = f"the last run ({record.run_id}) {how}; checked the export of run {other.run_id} (succeeded) instead: {path}"
        return path, Path(other.assets_dir) if other.assets_dir else None, note
    exported = record.extra.get("exported")
    if exported and Path(exported).exists():
        return Path(exported), Path(record.assets_dir) if record.assets_dir else None, None
    if not record.checkpoint_dir:
        raise UsageError(
            f"the last run ({record.run_id}) saved no checkpoint",
            hint="train with --finetune (exports HF safetensors), or pass the checkpoint folder",
        )
    path = Path(record.checkpoint_dir)
    if not path.exists():
        raise UsageError(
            f"the last run's checkpoint {path} does not exist (status: {record.status})",
            hint="pass the checkpoint folder explicitly",
        )
    return path, Path(record.assets_dir) if record.assets_dir else None, note


def _newest_succeeded_export(runs_dir: Path, *, exclude: str):
    from trnqwen.rundir import recent_records

    for _, record in recent_records(runs_dir):
        exported = record.extra.get("exported") if isinstance(record.extra, dict) else None
        if record.run_id != exclude and record.status == "succeeded" and exported and Path(exported).exists():
            return record, Path(exported)
    return None


def _assets_of_run_that_wrote(checkpoint: Path, run_config) -> Optional[Path]:
    """The assets dir of the run whose checkpoint folder is ``checkpoint`` (or holds it, for a
    ``step-N`` folder), so ``verify-ckpt ./checkpoint_x_ft`` needs no --assets."""
    from trnqwen.ckpt.layout import run_that_wrote

    found = run_that_wrote(checkpoint, Path(run_config.runs_dir) if run_config is not None else Path(".trnqwen/runs"))
    return Path(found[1].assets_dir) if found is not None and found[1].assets_dir else None
