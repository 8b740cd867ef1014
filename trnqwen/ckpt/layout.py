"""Where the checkpoint's files are, and which config.json describes them.

Accepted CHECKPOINT forms:
  * a checkpoint folder holding ``step-N/`` subfolders (torchtitan's ``checkpoint.folder``):
    the highest step with HF safetensors is taken, ``--step N`` picks another;
  * one ``step-N`` folder, or any folder of HF safetensors (``model*.safetensors`` with or
    without ``model.safetensors.index.json``);
  * a single ``.safetensors`` file, or a ``model.safetensors.index.json`` file.

torchtitan 0.3.0 exports the last step as ``<folder>/step-N/model-0000x-of-0000y.safetensors``
plus ``model.safetensors.index.json``; a ``sharded/`` subfolder holds the per-rank pieces it
consolidated from and is ignored here.  Pickle checkpoints (``*.bin``, ``*.pt``) are recognised
only to refuse them: unpickling runs arbitrary code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from trnqwen.assets import ADAPTER_CONFIG, INDEX_NAME
from trnqwen.errors import CheckFailed, UsageError
from trnqwen.fsutil import broken_link
from trnqwen.rundir import RunRecord

STEP_RE = re.compile(r"^step-(\d+)$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CONVERT_HINT = (
    "convert it once with weights_only loading, then verify the result: "
    "python -c \"import torch; from safetensors.torch import save_file; "
    "save_file(torch.load('pytorch_model.bin', weights_only=True), 'model.safetensors')\" "
    "(or AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out) if you trust the file)"
)


@dataclass
class CheckpointFiles:
    """The resolved checkpoint: its folder, its shard files and its index (if any)."""

    root: Path  # the folder holding the shards (a step-N folder or an HF folder)
    files: list[Path]
    index: Optional[Path] = None
    step: Optional[int] = None
    given: Optional[Path] = None  # what the user passed (or the run's checkpoint_dir)
    other_steps: list[int] = field(default_factory=list)
    # trnqwen's checkpoint folder (resume/ + hf/): every step, complete or not (checkpoints.FolderScan)
    folder: Optional[dict[str, Any]] = None
    note: Optional[str] = None  # e.g. "the last run failed; checked run X's export instead"


def _step_of(path: Path) -> Optional[int]:
    m = STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def _safetensors_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.safetensors") if p.is_file())


def _is_dcp(folder: Path) -> bool:
    return (folder / ".metadata").is_file() or any(folder.glob("*.distcp"))


def _refuse_pickles(folder: Path) -> None:
    pickles = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        shown = ", ".join(pickles[:3]) + (f" (+{len(pickles) - 3} more)" if len(pickles) > 3 else "")
        raise CheckFailed(
            f"{folder} holds only pickle checkpoint files ({shown}), not safetensors; "
            "trnqwen does not unpickle them (loading a pickle can run arbitrary code)",
            hint=CONVERT_HINT,
        )


def _files_of(folder: Path, step: Optional[int], given: Path) -> CheckpointFiles:
    files = _safetensors_in(folder)
    index = folder / INDEX_NAME
    if not files and not index.is_file() and not (folder / ADAPTER_CONFIG).is_file():
        raise AssertionError("caller checks that the folder holds safetensors")
    return CheckpointFiles(folder, files, index if index.is_file() else None, step, given)


def _has_hf(folder: Path) -> bool:
    """HF safetensors, their index, or a PEFT adapter's config (its weights may be missing: verify says so)."""
    return bool(_safetensors_in(folder)) or (folder / INDEX_NAME).is_file() or (folder / ADAPTER_CONFIG).is_file()


def resolve_checkpoint(path: Path, step: Optional[int] = None) -> CheckpointFiles:
    """Turn CHECKPOINT (+ ``--step``) into the shard files to check, or say clearly why not."""
    given = Path(path).expanduser()
    if not given.exists() and given.is_symlink():
        raise UsageError(f"{given} is a broken symbolic link or a symlink loop", hint="pass the real checkpoint folder")
    if not given.exists():
        raise UsageError(f"no such path: {given}", hint="pass the checkpoint folder, e.g. ./checkpoint_qwen3_4b_ft")
    if given.is_file():
        if step is not None:
            raise UsageError("--step applies to a checkpoint folder, not a single file")
        if given.name == INDEX_NAME:
            return CheckpointFiles(given.parent, _safetensors_in(given.parent), given, _step_of(given.parent), given)
        if given.suffix == ".safetensors":
            return CheckpointFiles(given.parent, [given], None, _step_of(given.parent), given)
        if given.suffix.lower() in PICKLE_SUFFIXES:
            raise CheckFailed(
                f"{given} is a pickle checkpoint, not safetensors; trnqwen does not unpickle it "
                "(loading a pickle can run arbitrary code)",
                hint=CONVERT_HINT,
            )
        raise UsageError(f"{given} is not a checkpoint (expected a folder, a .safetensors file or {INDEX_NAME})")

    if _is_layout_root(given):
        return _resolve_layout_root(given, step)
    steps = {}
    for child in given.iterdir():
        n = _step_of(child)
        if n is not None and child.is_dir():
            steps[n] = child
    own_step = _step_of(given)

    if step is not None:
        if own_step is not None and not steps:
            if own_step != step:
                raise UsageError(f"{given} is step {own_step}, but --step {step} was asked for")
            steps = {own_step: given}
        if step not in steps:
            have = ", ".join(str(s) for s in sorted(steps)) or "none"
            raise UsageError(f"no step-{step} folder in {given} (steps present: {have})")
        folder = steps[step]
        if _has_hf(folder):
            out = _files_of(folder, step, given)
            out.other_steps = sorted(s for s in steps if s != step)
            return out
        _explain_unusable(folder)

    if _has_hf(given):
        return _files_of(given, own_step, given)
    hf_steps = sorted(s for s, folder in steps.items() if _has_hf(folder))
    if hf_steps:
        out = _files_of(steps[hf_steps[-1]], hf_steps[-1], given)
        out.other_steps = sorted(s for s in steps if s != hf_steps[-1])
        return out
    if steps:
        _explain_unusable(steps[max(steps)], all_steps=sorted(steps))
    _explain_unusable(given)
    raise AssertionError("unreachable")


def _is_layout_root(folder: Path) -> bool:
    from trnqwen.contract import checkpoint_layout as checkpoints

    return (folder / checkpoints.EXPORT).is_dir() or (folder / checkpoints.RESUME).is_dir() or (
        folder / checkpoints.OWNER_FILE
    ).is_file()


def _resolve_layout_root(given: Path, step: Optional[int]) -> CheckpointFiles:
    """trnqwen's checkpoint folder: verify an HF export under ``hf/``; list every step."""
    from trnqwen.contract import checkpoint_layout as checkpoints

    found = checkpoints.scan(given)
    exports = checkpoints.export_root(given)
    if not any(s.complete for s in found.exports) and step is None:
        if found.resume:
            raise CheckFailed(
                f"{given} holds no complete HF export, only resumable training state ({found.describe()})",
                hint="finish the run (trnqwen train --resume) with --finetune or --export-hf to get hf/step-N",
            )
        what = found.describe()
        detail = "" if what == "no checkpoints" else f" ({what})"
        raise UsageError(f"{given} holds no checkpoints yet{detail}",
                         hint="train first (a run still starting writes its first one at its first save), or pass another folder")
    out = resolve_checkpoint(exports, step)
    out.given = given
    out.folder = found.as_dict()
    return out


def _explain_unusable(folder: Path, all_steps: Optional[list[int]] = None) -> None:
    from trnqwen.contract import checkpoint_layout as checkpoints

    if (folder / checkpoints.TRAINER_STATE).is_file():  # hf-trainer's resume/checkpoint-N
        root = folder.parent.parent if folder.parent.name == checkpoints.RESUME else folder.parent
        raise CheckFailed(
            f"{folder} is a resumable Trainer checkpoint (model and optimizer in DCP form), not HF safetensors",
            hint=f"verify the run's export instead: trnqwen verify-ckpt {root} (an unfinished run: "
            "trnqwen train --resume writes it)",
        )
    if _is_dcp(folder):
        which = f" (steps {', '.join(map(str, all_steps))})" if all_steps else ""
        raise CheckFailed(
            f"{folder} is a torchtitan DCP checkpoint{which}, not HF safetensors",
            hint="train with --finetune (or --export-hf) so the last step is saved with "
            "checkpoint.last_save_in_hf, or convert it with torchtitan's checkpoint conversion script",
        )
    sharded = folder / "sharded"
    if sharded.is_dir() and _safetensors_in(sharded):
        raise CheckFailed(
            f"{folder} holds only per-rank pieces under sharded/, never consolidated (the export was interrupted?)",
            hint="re-run the export; the consolidated model-*.safetensors files belong beside sharded/",
        )
    if any(folder.iterdir()):
        _refuse_pickles(folder)
        for path in sorted(folder.glob("*.safetensors")):
            link = broken_link(path)
            if link:  # listed by the glob, but not a file: say what it is, not "no *.safetensors"
                raise UsageError(
                    f"{path} is {link}, not a safetensors file",
                    hint="replace the link with the real file (or point it at one), then run verify-ckpt again",
                )
        raise UsageError(
            f"no checkpoint in {folder}: no *.safetensors, no {INDEX_NAME}, no step-N/ folders",
            hint="pass the checkpoint folder torchtitan wrote (checkpoint.folder) or a step-N folder inside it",
        )
    raise UsageError(
        f"{folder} is empty: no checkpoint to verify",
        hint="pass the checkpoint folder torchtitan wrote (checkpoint.folder) or a step-N folder inside it",
    )


# --- config.json ----------------------------------------------------------------------------


@dataclass
class ModelConfig:
    path: Path
    data: dict[str, Any]
    source: str  # how it was found: "--assets", "beside the checkpoint", "run record", "config"


def _load_config(path: Path, source: str) -> ModelConfig:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", hint="config.json must be the model's HF config") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object", hint="config.json must be the model's HF config")
    return ModelConfig(path, data, source)


def find_config(
    ckpt: CheckpointFiles,
    *,
    assets: Optional[Path] = None,
    run_assets: Optional[Path] = None,
    config_assets: Optional[Path] = None,
) -> ModelConfig:
    """config.json from ``--assets``, else beside the checkpoint (step folder and up to two
    parents), else the run record's assets dir, else the configured assets dir."""
    if assets is not None:
        assets = Path(assets).expanduser()
        candidate = assets if assets.is_file() else assets / "config.json"
        if not candidate.is_file():
            raise UsageError(
                f"no config.json in {assets}",
                hint="--assets must be the model's HF snapshot (trnqwen fetch downloads it)",
            )
        return _load_config(candidate, "--assets")
    folder = ckpt.root
    for level in range(3):
        candidate = folder / "config.json"
        if candidate.is_file():
            return _load_config(candidate, "beside the checkpoint")
        if folder.parent == folder:
            break
        folder = folder.parent
    for where, source in ((run_assets, "the run record's assets"), (config_assets, "the configured assets dir")):
        if where is not None and (Path(where) / "config.json").is_file():
            return _load_config(Path(where) / "config.json", source)
    tried = [str(ckpt.root)] + [str(p) for p in (run_assets, config_assets) if p is not None]
    raise UsageError(
        f"no config.json to build the model from (looked beside the checkpoint and in {', '.join(tried[1:]) or 'no assets dir'})",
        hint="pass --assets DIR, the model snapshot the checkpoint was trained from (trnqwen fetch <model>)",
    )


# --- which run wrote a checkpoint -------------------------------------------------------------


def _resolved(path: Union[str, Path]) -> Optional[Path]:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, TypeError):
        return None


def _wrote(record: RunRecord, target: Path, holding: bool) -> bool:
    for written in (record.checkpoint_dir, (record.extra or {}).get("exported")):
        where = _resolved(written) if written else None
        if where is not None and (target == where or where in target.parents or (holding and target in where.parents)):
            return True
    return False


def run_that_wrote(path: Path, runs_dir: Optional[Path], *, holding: bool = False) -> Optional[tuple[Path, RunRecord]]:
    """(run dir, :class:`trnqwen.rundir.RunRecord`) of the run whose checkpoint folder or export is
    ``path`` or holds it (``holding``: or that ``path`` holds): the newest such run under
    ``runs_dir``, else the run the checkpoint folder's owner file names, so a command run from
    any other folder still finds it (the owner file records the run directory; an older one
    without it: ``<the folder's parent>/.trnqwen/runs/<run id>``, where a default run puts it)."""
    from trnqwen.contract.checkpoint_layout import OWNER_FILE, read_owner
    from trnqwen.rundir import recent_records

    target = _resolved(path)
    if target is None:
        return None
    for run_dir, record in recent_records(Path(runs_dir)) if runs_dir is not None and Path(runs_dir).is_dir() else []:
        if _wrote(record, target, holding):
            return run_dir, record
    for folder in [target, *list(target.parents)[:3]]:
        owner = read_owner(folder) if (folder / OWNER_FILE).is_file() else None
        if not owner or not isinstance(owner.get("run_id"), str):
            continue
        for run_dir in (owner.get("run_dir"), folder.parent / ".trnqwen" / "runs" / owner["run_id"]):
            try:
                record = RunRecord.load(Path(run_dir)) if run_dir else None
            except (OSError, ValueError, TypeError):
                continue
            if record is not None and _wrote(record, target, holding):
                return Path(run_dir), record
        return None
    return None
