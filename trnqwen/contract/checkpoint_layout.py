"""The checkpoint folder layout: resume points and HF exports live apart, so neither is mistaken
for the other (docs/resume.md).

    <checkpoint_dir>/
      trnqwen-checkpoints.json   owner: the run that writes here (run_id, model, backend, run_dir)
      resume/step-N/             torchtitan DCP (complete once ``.metadata`` exists: DCP writes it last)
      resume/checkpoint-N/       hf-trainer: the Trainer's checkpoint (complete once ``trainer_state.json`` exists)
      hf/step-N/                 HF safetensors export (complete once ``model.safetensors.index.json`` exists)

torchtitan's ``checkpoint.folder`` is ``resume/``: it resumes from any ``step-N`` holding DCP
metadata *or* an HF index, so an export beside its resume points would be taken for one (the
"same command twice" crash).  Pure Python, shared by the launcher and the ranks.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import ADAPTER_CONFIG, INDEX_NAME, TOKENIZER_FILES
from trnqwen.errors import UsageError

RESUME = "resume"
EXPORT = "hf"
OWNER_FILE = "trnqwen-checkpoints.json"
DCP_METADATA = ".metadata"
TRAINER_STATE = "trainer_state.json"
LOCK_NAME = ".trnqwen-lock"  # the owner's flock (trnqwen.train.folder_lock)
_STEP = re.compile(r"^(?:step|checkpoint)-(\d+)$")
# Files torchtitan or the Trainer put beside their step folders; anything else is foreign.
_KNOWN_EXTRA = {OWNER_FILE, LOCK_NAME, ".DS_Store", "README.md", "runs"}
# Every file name trnqwen, torchtitan (DCP, the HF export) and the Trainer write inside a step
# folder; --overwrite deletes these and nothing else.
_WRITTEN = re.compile(
    r"\.metadata(\.tmp)?|__\d+_\d+\.distcp|[\w.\-]+\.safetensors|[\w.\-]+\.safetensors\.index\.json|"
    r"config\.json|adapter_config\.json|generation_config\.json|README\.md|trainer_state\.json|rng_state(_\d+)?\.pth|"
    r"scheduler\.pt|optimizer\.pt|training_args\.bin|"
    + "|".join(re.escape(name) for name in TOKENIZER_FILES)
)
_WRITTEN_DIRS = {"dcp"}  # the Trainer's checkpoint-N/dcp/ (trnqwen.runtime.hf_trainer_checkpoint)
# hf/step-N.sharded: the export's pieces; hf/step-N.merged: a LoRA adapter merged into its base (--merge)
_STEP_OR_SHARDS = re.compile(r"^(?:step|checkpoint)-\d+(?:\.sharded|\.merged)?$")


def resume_dir(root: Path) -> Path:
    return Path(root) / RESUME


def export_root(root: Path) -> Path:
    return Path(root) / EXPORT


def export_dir(root: Path, step: int) -> Path:
    """Where the HF export of ``step`` goes (helper code writing config/tokenizer/model card uses this)."""
    return export_root(root) / f"step-{step}"


def root_of_resume_folder(folder: str | Path) -> Optional[Path]:
    """The checkpoint root of a ``.../resume`` folder (what the ranks get as checkpoint.folder)."""
    folder = Path(folder)
    return folder.parent if folder.name == RESUME else None


@dataclass
class StepFolder:
    step: int
    path: Path
    kind: str  # "dcp" | "trainer" | "hf" | "legacy"
    complete: bool

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "path": str(self.path), "kind": self.kind, "complete": self.complete}


@dataclass
class FolderScan:
    """What a checkpoint folder holds."""

    root: Path
    resume: list[StepFolder] = field(default_factory=list)
    exports: list[StepFolder] = field(default_factory=list)
    legacy: list[StepFolder] = field(default_factory=list)  # step-N directly under the root (older trnqwen)
    foreign: list[str] = field(default_factory=list)  # names that are no checkpoint of ours
    owner: Optional[dict[str, Any]] = None

    @property
    def has_checkpoints(self) -> bool:
        return bool(self.resume or self.exports or self.legacy)

    @property
    def latest_resume(self) -> Optional[StepFolder]:
        done = [s for s in self.resume if s.complete]
        return max(done, key=lambda s: s.step) if done else None

    @property
    def latest_export(self) -> Optional[StepFolder]:
        done = [s for s in self.exports if s.complete]
        return max(done, key=lambda s: s.step) if done else None

    def describe(self) -> str:
        """``resume steps 4, 8 (6 incomplete); exports 8``: one phrase for messages."""
        parts = []
        for label, items in (("resume steps", self.resume), ("HF exports", self.exports), ("old-layout steps", self.legacy)):
            if items:
                done = [str(s.step) for s in items if s.complete]
                bad = [str(s.step) for s in items if not s.complete]
                text = f"{label} {', '.join(done) or 'none complete'}"
                if bad:
                    text += f" ({', '.join(bad)} incomplete)"
                parts.append(text)
        return "; ".join(parts) or "no checkpoints"

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "owner": self.owner,
            "resume": [s.as_dict() for s in self.resume],
            "exports": [s.as_dict() for s in self.exports],
            "legacy": [s.as_dict() for s in self.legacy],
            "foreign": self.foreign,
        }


def _steps(folder: Path, kind_of) -> list[StepFolder]:
    out = []
    try:
        children = list(folder.iterdir())
    except OSError:
        return out
    for child in children:
        m = _STEP.match(child.name)
        if m and child.is_dir():
            kind, complete = kind_of(child)
            out.append(StepFolder(int(m.group(1)), child, kind, complete))
    return sorted(out, key=lambda s: s.step)


def _resume_kind(path: Path) -> tuple[str, bool]:
    if path.name.startswith("checkpoint-"):
        return "trainer", (path / TRAINER_STATE).is_file()
    return "dcp", (path / DCP_METADATA).is_file()


def _export_kind(path: Path) -> tuple[str, bool]:
    if (path / ADAPTER_CONFIG).is_file():  # a LoRA run's PEFT adapter (written last: complete)
        return "adapter", True
    return "hf", (path / INDEX_NAME).is_file()


def _legacy_kind(path: Path) -> tuple[str, bool]:
    if (path / DCP_METADATA).is_file():
        return "legacy", True
    return "legacy", (path / INDEX_NAME).is_file()


def scan(root: Path) -> FolderScan:
    root = Path(root)
    out = FolderScan(root=root)
    if not root.is_dir():
        return out
    out.resume = _steps(resume_dir(root), _resume_kind)
    out.exports = _steps(export_root(root), _export_kind)
    out.legacy = _steps(root, _legacy_kind)
    out.owner = read_owner(root)
    for child in sorted(root.iterdir()):
        if child.name in (RESUME, EXPORT) or child.name in _KNOWN_EXTRA or _STEP.match(child.name):
            continue
        out.foreign.append(child.name)
    return out


def read_owner(root: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads((Path(root) / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_owner(root: Path, *, run_id: str, model: str, backend: str, run_dir: Optional[Path] = None) -> None:
    """The owner file; ``run_dir`` (absolute) lets a command run from any folder find the run's record."""
    from trnqwen.fsutil import write_json_atomic

    Path(root).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(root) / OWNER_FILE, {"run_id": run_id, "model": model, "backend": backend,
                                                "run_dir": str(run_dir) if run_dir is not None else None,
                                                "created_at": time.time()})


# --- the rules -----------------------------------------------------------------------------------


def check_for_new_run(root: Path, *, overwrite: bool) -> FolderScan:
    """A new run may start in ``root`` only when it holds no checkpoints (or ``--overwrite``).

    Raises :class:`UsageError` (nothing written) with the three ways on; returns the scan.
    """
    found = scan(root)
    if found.foreign:
        shown = ", ".join(found.foreign[:3]) + (" ..." if len(found.foreign) > 3 else "")
        raise UsageError(
            f"checkpoint folder {root} holds files that are not trnqwen, torchtitan or Trainer checkpoints ({shown})",
            hint="pass --checkpoint-dir with an empty or new folder (--overwrite never deletes files it does not know)",
        )
    if not found.has_checkpoints:
        return found
    if overwrite:
        foreign = not_written_by_us(found)
        if foreign:
            raise overwrite_refusal(root, foreign)
        return found
    owner = (found.owner or {}).get("run_id")
    whose = f" of run {owner}" if owner else ""
    resume = f"trnqwen train --resume {owner}" if owner else "trnqwen train --resume RUN_ID"
    raise UsageError(
        f"checkpoint folder {root} already holds checkpoints{whose} ({found.describe()})",
        hint=f"continue that run with `{resume}`, start fresh elsewhere with --checkpoint-dir NEW_FOLDER, "
        "or replace them with --overwrite",
    )


def _ours(rel: Path, is_dir: bool) -> bool:
    """Whether ``rel`` (a path inside a step folder) is something trnqwen or its trainers write."""
    parts = rel.parts
    if len(parts) == 1:
        return parts[0] in _WRITTEN_DIRS if is_dir else bool(_WRITTEN.fullmatch(parts[0]))
    return len(parts) == 2 and parts[0] in _WRITTEN_DIRS and not is_dir and bool(_WRITTEN.fullmatch(parts[1]))


def step_folders(found: FolderScan) -> list[Path]:
    """Every folder --overwrite would remove: resume points, exports (and their ``.sharded`` pieces),
    old-layout steps."""
    out: list[Path] = []
    for top in (resume_dir(found.root), export_root(found.root)):
        if top.is_dir():
            out += sorted(p for p in top.iterdir() if p.is_dir() and _STEP_OR_SHARDS.match(p.name))
    return out + [s.path for s in found.legacy]


def not_written_by_us(found: FolderScan) -> list[str]:
    """Paths (relative to the root) inside trnqwen's own subfolders that no trnqwen run wrote:
    a user's notes in ``hf/step-3/``, an ``eval_outputs/`` folder, anything loose in ``resume/``."""
    foreign: list[str] = []
    steps = set(step_folders(found))
    for top in (resume_dir(found.root), export_root(found.root)):
        if top.is_dir():
            foreign += [f"{p.relative_to(found.root)}{'/' if p.is_dir() else ''}" for p in sorted(top.iterdir()) if p not in steps]
    for folder in sorted(steps):
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            below_foreign = any(not _ours(Path(*rel.parts[:i]), True) for i in range(1, len(rel.parts)))
            if not below_foreign and not _ours(rel, path.is_dir()):  # a foreign folder once, not each file in it
                foreign.append(f"{path.relative_to(found.root)}{'/' if path.is_dir() else ''}")
    return foreign


def clear(found: FolderScan) -> list[str]:
    """``--overwrite``: remove our own checkpoints, file by file, only names trnqwen writes.

    Refuses (:class:`UsageError`, nothing deleted) when anything else is inside them."""
    foreign = not_written_by_us(found)
    if foreign:
        raise overwrite_refusal(found.root, foreign)
    removed = []
    for folder in step_folders(found):
        for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        folder.rmdir()
        removed.append(str(folder))
    for top in (resume_dir(found.root), export_root(found.root)):
        if top.is_dir() and not any(top.iterdir()):
            top.rmdir()
    (found.root / OWNER_FILE).unlink(missing_ok=True)
    return removed


def overwrite_refusal(root: Path, foreign: list[str]) -> UsageError:
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return UsageError(
        f"--overwrite: checkpoint folder {root} holds files trnqwen did not write ({shown}); it deletes only its own",
        hint="move those files out of the folder first, or pass --checkpoint-dir with a new folder",
    )


def remove_incomplete(root: Optional[Path], before: set[str]) -> list[str]:
    """Delete step folders a failed or killed run started but never finished.

    Complete folders and folders that existed before the run (``before``: see :func:`step_paths`)
    are never touched; a half-written one left in place would look like a checkpoint.
    """
    if root is None:
        return []
    found = scan(root)
    removed = []
    for s in (*found.resume, *found.exports, *found.legacy):
        if not s.complete and str(s.path) not in before:
            shutil.rmtree(s.path, ignore_errors=True)
            removed.append(str(s.path))
    return removed


def step_paths(root: Optional[Path]) -> set[str]:
    if root is None:
        return set()
    found = scan(root)
    return {str(s.path) for s in (*found.resume, *found.exports, *found.legacy)}


def find_export(root: Optional[Path], *, step: Optional[int] = None) -> Optional[Path]:
    """The newest complete HF export (``hf/step-N``; an old-layout ``step-N`` with an index too);
    with ``step``, only the export of that step (a run reports the export of the step it trained)."""
    if root is None:
        return None
    found = scan(root)
    if step is not None:
        return next((s.path for s in found.exports if s.step == step and s.complete), None)
    latest = found.latest_export
    if latest is not None:
        return latest.path
    legacy = [s for s in found.legacy if (s.path / INDEX_NAME).is_file()]
    return max(legacy, key=lambda s: s.step).path if legacy else None
