"""What ``trnqwen eval`` compares: CHECKPOINT arguments -> model folders, their runs, the base.

A CHECKPOINT is any of: an HF model folder (an export, or a base snapshot), a PEFT LoRA adapter
folder (a LoRA run's export: evaluated as base + adapter), a checkpoint folder with ``step-N/``
subfolders, a run directory, or a run id (``<runs_dir>/<id>``).  A run names
its export, the base model it started from (its assets) and the data it validated on, so with
no argument at all the last run answers every question.

Everything here reads JSON and file names only: no torch, nothing written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import has_tokenizer
from trnqwen.errors import UsageError
from trnqwen.rundir import RUN_RECORD, RunRecord, last_run_dir, live_launcher

# config.json fields that must agree for two checkpoints to be the same architecture.
ARCHITECTURE_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "tie_word_embeddings",
)


@dataclass
class RunInfo:
    """A recorded run (``run.json``) and what eval needs from it."""

    run_dir: Path
    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def assets(self) -> Optional[Path]:
        return Path(self.record.assets_dir) if self.record.assets_dir else None

    @property
    def seq_len(self) -> Optional[int]:
        value = (self.record.config or {}).get("seq_len")
        return int(value) if isinstance(value, int) else None

    @property
    def export(self) -> Optional[Path]:
        """The run's HF export: what the launcher recorded, else its checkpoint folder."""
        exported = self.record.extra.get("exported")
        if exported and Path(exported).exists():
            return Path(exported)
        if self.record.checkpoint_dir and Path(self.record.checkpoint_dir).exists():
            return Path(self.record.checkpoint_dir)
        return None

    @property
    def dataset_cache(self) -> Optional[Path]:
        """The tokenized dataset the run trained on (the cache its validation split lives in)."""
        extra = self.record.extra
        for value in (extra.get("dataset_cache"), (extra.get("dataset") or {}).get("cache_dir")
                      if isinstance(extra.get("dataset"), dict) else None):
            if value and Path(value).is_dir():
                return Path(value)
        return None


@dataclass
class EvalTarget:
    """One model to evaluate."""

    label: str  # the name in the table and the JSON ("base" for the base model)
    folder: Path  # the folder of HF safetensors from_pretrained reads
    config_dir: Path  # where its config.json is (the folder itself for a complete export)
    run: Optional[RunInfo] = None
    is_base: bool = False
    adapter: Optional[Path] = None  # a PEFT LoRA adapter folder loaded onto ``folder`` (the base) with peft

    @property
    def export(self) -> Path:
        """The folder the run exported: the adapter for a LoRA run, else the model folder."""
        return self.adapter or self.folder

    @property
    def config(self) -> dict[str, Any]:
        return json.loads((self.config_dir / "config.json").read_text(encoding="utf-8"))

    @property
    def tokenizer_dir(self) -> Path:
        """The tokenizer beside the weights (a complete export), else beside its config.json."""
        if has_tokenizer(self.folder):
            return self.folder
        return self.config_dir


def load_run(run_dir: Path) -> RunInfo:
    try:
        return RunInfo(Path(run_dir), RunRecord.load(Path(run_dir)))
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read the run record {Path(run_dir) / RUN_RECORD}: {exc}") from None


def last_run(runs_dir: Path) -> RunInfo:
    run_dir = last_run_dir(runs_dir) if runs_dir.is_dir() else None
    if run_dir is None:
        raise UsageError(
            f"no CHECKPOINT given and no previous run under {runs_dir}",
            hint="train first (trnqwen train --finetune), or pass a checkpoint folder or run id",
        )
    return load_run(run_dir)


def run_that_wrote(path: Path, runs_dir: Path) -> Optional[RunInfo]:
    """The run whose checkpoint folder or export is ``path``, holds it or is held by it
    (:func:`trnqwen.ckpt.layout.run_that_wrote`: the runs under ``runs_dir``, else the folder's owner file)."""
    from trnqwen.ckpt.layout import run_that_wrote as find

    found = find(path, runs_dir, holding=True)
    return RunInfo(*found) if found is not None else None


def resolve_target(arg: Optional[str], runs_dir: Path, *, cwd: Optional[Path] = None, base_dir: Optional[Path] = None,
                   base_flag: str = "--base-dir") -> EvalTarget:
    """One CHECKPOINT argument (None = the last run) -> the model folder to load (``base_dir``,
    ``--base-dir``: the base a LoRA adapter is loaded onto; ``base_flag``: what the calling command
    calls that option, for its messages; ``trnqwen push`` resolves its RUN|FOLDER here too).

    Raises :class:`UsageError` (exit 2) for a path that does not exist and a run id that
    names no run.
    """
    cwd = Path(cwd or Path.cwd())
    if arg is None:
        return _target_of_run(last_run(runs_dir), base_dir, base_flag)
    path = Path(arg).expanduser()
    if not path.is_absolute():
        path = cwd / path
    if path.is_dir() and (path / RUN_RECORD).is_file():
        return _target_of_run(load_run(path), base_dir, base_flag)
    if path.exists():
        return _target_of_folder(path, arg, run_that_wrote(path, runs_dir), base_dir, base_flag)
    if "/" not in arg and (runs_dir / arg / RUN_RECORD).is_file():
        return _target_of_run(load_run(runs_dir / arg), base_dir, base_flag)
    if "/" not in arg and not arg.startswith("."):
        raise UsageError(
            f"no checkpoint or run named {arg!r}: no such path, and no run {arg} under {runs_dir}",
            hint=f"pass a checkpoint folder, a run directory, or a run id listed in {runs_dir}",
        )
    raise UsageError(f"no such checkpoint: {arg}", hint="pass the export folder (checkpoint_<slug>_<hash6>_ft/hf/step-N) or a run id")


def _target_of_run(run: RunInfo, base_dir: Optional[Path] = None, base_flag: str = "--base-dir") -> EvalTarget:
    export = run.export
    if export is None:
        raise UsageError(
            f"run {run.run_id} has no HF export (status: {run.record.status})",
            hint="fine-tune with --finetune (exports HF safetensors), or pass a checkpoint folder",
        )
    return _target_of_folder(export, run.run_id, run, base_dir, base_flag)


def _target_of_folder(path: Path, label: str, run: Optional[RunInfo], base_dir: Optional[Path] = None,
                      base_flag: str = "--base-dir") -> EvalTarget:
    from trnqwen.ckpt.layout import find_config, resolve_checkpoint
    from trnqwen.ckpt.verify_adapter import find_base_config, is_adapter
    from trnqwen.errors import TrnqwenError

    try:
        ckpt = resolve_checkpoint(path)
    except TrnqwenError:
        pid = live_launcher(run.record) if run is not None else None
        if pid is not None:
            raise UsageError(
                f"run {run.run_id} is still running (launcher pid {pid}): it writes its export at its last step",
                hint="evaluate it when it has finished (`trnqwen inspect-logs --follow` shows it), or pass an earlier export",
            ) from None
        raise
    if is_adapter(ckpt):  # base + adapter: the base is the run's assets, else adapter_config's base model
        base = find_base_config(ckpt, base=base_dir, run_assets=run.assets if run else None, base_flag=base_flag).path.parent
        if run is not None and ckpt.step is not None and label == run.run_id:
            label = f"{run.run_id}/step-{ckpt.step}"
        return EvalTarget(label=f"{label} (LoRA adapter)", folder=base, config_dir=base, run=run, adapter=ckpt.root)
    if ckpt.index is None and [p.name for p in ckpt.files] != ["model.safetensors"] and not (
        ckpt.root / "config.json"
    ).is_file():
        raise UsageError(
            f"{path} is a loose safetensors file, not a model folder",
            hint="pass the folder holding model.safetensors.index.json (the export's step-N folder)",
        )
    model_config = find_config(ckpt, run_assets=run.assets if run else None)
    if run is not None and ckpt.step is not None and label == run.run_id:
        label = f"{run.run_id}/step-{ckpt.step}"
    return EvalTarget(label=label, folder=ckpt.root, config_dir=model_config.path.parent, run=run)


def base_target(targets: list[EvalTarget], base_dir: Optional[Path] = None) -> Optional[EvalTarget]:
    """The base model: ``base_dir`` (``--base-dir``), else the one the first target's run started
    from (its assets), or the one a LoRA adapter is loaded onto, when known."""
    if base_dir is not None:
        return EvalTarget(label="base", folder=Path(base_dir), config_dir=Path(base_dir), is_base=True,
                          run=next((t.run for t in targets if t.run is not None), None))
    for target in targets:
        if target.run is not None and target.run.assets is not None and (target.run.assets / "config.json").is_file():
            assets = target.run.assets
            return EvalTarget(label="base", folder=assets, config_dir=assets, run=target.run, is_base=True)
        if target.adapter is not None:
            return EvalTarget(label="base", folder=target.folder, config_dir=target.config_dir, run=target.run, is_base=True)
    return None


def check_same_architecture(base: EvalTarget, others: list[EvalTarget]) -> None:
    """Every checkpoint must be the base's architecture: otherwise the comparison means nothing."""
    want = base.config
    for target in others:
        have = target.config
        differ = [
            f"{name} {have.get(name)!r} vs {want.get(name)!r}"
            for name in ARCHITECTURE_FIELDS
            if name in want or name in have
            if have.get(name) != want.get(name)
        ]
        if differ:
            raise UsageError(
                f"{target.label} is not the base model's architecture ({base.folder}): {', '.join(differ[:3])}",
                hint="compare checkpoints of one model, or pass --no-base",
            )


def unique_labels(targets: list[EvalTarget]) -> None:
    seen: dict[str, int] = {}
    for target in targets:
        n = seen.get(target.label, 0)
        seen[target.label] = n + 1
        if n:
            target.label = f"{target.label} ({n + 1})"
