"""Merge a LoRA adapter into its base: a whole model folder that needs no peft.

``W' = W + scaling * B @ A`` for every module peft adapts, computed in float32 and cast to the
base tensor's dtype (what peft's ``merge_and_unload`` does), with peft's own reading of
adapter_config.json (:mod:`trnqwen.ckpt.adapter_rules`: ``use_rslora``, ``rank_pattern``,
``alpha_pattern``, ``layers_to_transform``, ``exclude_modules``...; what a plain merge cannot
reproduce, such as DoRA or a PiSSA initialisation, is refused by name).  Before a byte is written
the adapter passes verify-ckpt's header checks against the base, so a broken adapter gets
verify-ckpt's diagnosis and exit code.  Every other tensor is copied as it is.  Shards keep the
base's file names and index, so the folder reads like the published snapshot; config.json,
generation config, tokenizer (with the chat template) and a model card carrying the adapter
run's facts complete it (:func:`trnqwen.ckpt.model_folder.complete_export`).

Used by ``trnqwen train --lora --merge`` (``hf/step-N.merged`` beside the adapter, which step
scans ignore like ``step-N.sharded``) and by ``trnqwen merge ADAPTER [--base DIR] [--out DIR]``.
The result appears whole or not at all, with the modes every export has: it is written into a
temporary sibling and renamed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import ADAPTER_CONFIG, ADAPTER_WEIGHTS, INDEX_NAME
from trnqwen.ckpt.model_folder import CardInfo
from trnqwen.errors import CheckFailed, UsageError

MERGED_SUFFIX = ".merged"


@dataclass
class MergeResult:
    out: Path
    base: Path
    adapter: Path
    merged_modules: int
    tensors: int
    seconds: float
    files: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out), "base": str(self.base), "adapter": str(self.adapter),
            "merged_modules": self.merged_modules, "tensors": self.tensors, "seconds": round(self.seconds, 3),
            "files": self.files,
        }


def merged_path(adapter: Path) -> Path:
    """``hf/step-N`` -> ``hf/step-N.merged`` (the default output)."""
    return adapter.with_name(adapter.name + MERGED_SUFFIX)


def _base_shards(base: Path) -> list[Path]:
    index = base / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        return [base / name for name in sorted(set(weight_map.values()))]
    shards = sorted(base.glob("*.safetensors"))
    if not shards:
        raise UsageError(f"{base} holds no *.safetensors: not a base model folder", hint="pass the base snapshot with --base")
    return shards


def _refusal(adapter: Path, problems: list[str], *, base: Optional[Path] = None) -> CheckFailed:
    """verify-ckpt's diagnosis as merge's error (exit 1): the first problem, then the others."""
    if base is not None:
        message = f"{adapter} does not fit the base {base}: this adapter was not trained on this base ({problems[0]})"
        hint = "pass the base the run started from with --base"
    else:
        message = f"{adapter} cannot be merged: {problems[0]}"
        hint = f"`trnqwen verify-ckpt {adapter}` checks it in full"
    exc = CheckFailed(message, hint=hint)
    if len(problems) > 1:
        exc.problems = [message, *problems[1:]]  # one line each at the CLI edge
    return exc


def check_adapter_folder(adapter: Path) -> None:
    """The adapter folder itself, before any base is looked for: UsageError when it is no adapter
    at all, CheckFailed with verify-ckpt's words when its config or weights file is broken."""
    from trnqwen.ckpt.verify_adapter import own_problems

    if not adapter.is_dir():
        raise UsageError(f"no such adapter folder: {adapter}" if not adapter.exists() else f"{adapter} is a file, not an adapter folder",
                         hint="pass the hf/step-N folder a --lora run exported")
    if not (adapter / ADAPTER_CONFIG).is_file() and not (adapter / ADAPTER_WEIGHTS).is_file():
        raise UsageError(f"{adapter} is not a LoRA adapter folder (no {ADAPTER_CONFIG}, no {ADAPTER_WEIGHTS})",
                         hint="pass the hf/step-N folder a --lora run exported")
    problems = own_problems(adapter)
    if problems:
        raise _refusal(adapter, problems)


def _check_against_base(adapter: Path, base: Path) -> None:
    """verify-ckpt's header checks of the adapter against the base (keys, targets, ranks, shapes)."""
    from trnqwen.ckpt.layout import CheckpointFiles, _load_config
    from trnqwen.ckpt.verify_adapter import verify_adapter

    report = verify_adapter(CheckpointFiles(adapter, [adapter / ADAPTER_WEIGHTS]),
                            _load_config(base / "config.json", "--base"), quick=True)
    if report.problems:
        misfit = bool(report.shape_mismatches or report.unknown_modules)
        raise _refusal(adapter, report.problems, base=base if misfit else None)


def merge_adapter(adapter: Path, base: Path, out: Optional[Path] = None, *, card_info: Optional[CardInfo] = None) -> MergeResult:
    """Write base + adapter as one model folder at ``out`` (default ``<adapter>.merged``)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from trnqwen.ckpt.adapter_rules import scaling_of
    from trnqwen.ckpt.model_folder import complete_export
    from trnqwen.contract.peft_adapter import read_adapter
    from trnqwen.fsutil import usual_modes

    started = time.perf_counter()
    adapter, base = Path(adapter).absolute(), Path(base).absolute()
    check_adapter_folder(adapter)
    if not (base / "config.json").is_file():
        raise UsageError(f"{base} is not a model folder (no config.json)", hint="pass the base snapshot with --base")
    out = Path(out).absolute() if out is not None else merged_path(adapter)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already exists and is not empty", hint="remove it, or pass another --out")
    _check_against_base(adapter, base)
    config, modules = read_adapter(adapter)
    pending = {f"{module}.weight": (module, ab) for module, ab in modules.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tensors = 0
    try:
        for shard in _base_shards(base):
            merged: dict[str, Any] = {}
            with safe_open(str(shard), framework="pt") as reader:
                metadata = reader.metadata()
                for key in reader.keys():
                    weight = reader.get_tensor(key)
                    found = pending.pop(key, None)
                    if found is not None:
                        module, (a, b) = found[0], (t.to(torch.float32) for t in found[1])
                        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
                            raise CheckFailed(f"{module}: the adapter holds NaN/Inf values: the merged model would too",
                                              hint="the run diverged: trnqwen inspect-logs shows where")
                        delta = scaling_of(module, config) * (b @ a)
                        weight = (weight.to(torch.float32) + delta).to(weight.dtype)
                    merged[key] = weight.contiguous()
                    tensors += 1
            save_file(merged, str(tmp / shard.name), metadata=metadata or {"format": "pt"})
        if pending:
            missing = sorted(pending)
            raise CheckFailed(
                f"{len(missing)} adapted module(s) have no weight in the base, e.g. {missing[0]}: "
                "this adapter was not trained on this base",
                hint="pass the base the run started from with --base",
            )
        if (base / INDEX_NAME).is_file():
            shutil.copyfile(base / INDEX_NAME, tmp / INDEX_NAME)
        info = card_info or CardInfo(base_model=str(config.get("base_model_name_or_path") or base), backend="")
        info.adapter, info.merged_adapter = None, config
        files = complete_export(tmp, base, info)
        usual_modes(tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return MergeResult(out=out, base=base, adapter=adapter, merged_modules=len(modules), tensors=tensors,
                       seconds=time.perf_counter() - started, files=sorted(p.name for p in out.iterdir()) or files)


def merge(adapter: Optional[Path], *, runs_dir: Path, base: Optional[Path] = None, out: Optional[Path] = None) -> MergeResult:
    """``trnqwen merge``: the adapter (default: the last run's export) checked on its own, its base
    found (``--base``, else the run that wrote it, found from any folder, else adapter_config's
    ``base_model_name_or_path``), then merged with a card carrying that run's facts."""
    from trnqwen.ckpt.layout import CheckpointFiles, run_that_wrote
    from trnqwen.ckpt.model_folder import card_info
    from trnqwen.ckpt.verify_adapter import find_base_config
    from trnqwen.contract.checkpoint_layout import read_owner

    if adapter is None:
        from trnqwen.rundir import recent_records

        exported = next((r.extra.get("exported") for _d, r in recent_records(runs_dir) if (r.extra or {}).get("exported")), None)
        if exported is None:
            raise UsageError("no adapter given and no run with an export found", hint="trnqwen merge ./checkpoint_.../hf/step-N")
        adapter = Path(exported)
    adapter = Path(adapter).absolute()
    check_adapter_folder(adapter)
    found = run_that_wrote(adapter, runs_dir)
    record = found[1] if found is not None else None
    run_assets = Path(record.assets_dir) if record is not None and record.assets_dir else None
    base = find_base_config(CheckpointFiles(adapter, []), base=base, run_assets=run_assets).path.parent
    if record is not None:
        info = card_info(record)
    else:  # no run record: what the adapter says of its base, and the backend its folder's owner file names
        from trnqwen.contract.peft_adapter import read_adapter_config

        owner = next((o for o in map(read_owner, list(adapter.parents)[:2]) if o), None) or {}
        info = CardInfo(base_model=str(read_adapter_config(adapter).get("base_model_name_or_path") or base),
                        backend=str(owner.get("backend") or ""))
    return merge_adapter(adapter, base, out, card_info=info)


def merge_in_child(adapter: Path, base: Path, *, timeout: float = 3600) -> dict[str, Any]:
    """``trnqwen merge --json`` in a child process (the launcher never imports torch); its result,
    or ``{"error": ...}`` with the child's last line."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "trnqwen", "merge", str(adapter), "--base", str(base), "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"error": f"merge took longer than {timeout:.0f}s"}
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    if proc.returncode != 0:  # --json's error object, else the child's last error line
        if isinstance(doc, dict) and doc.get("error"):
            return {"error": str(doc["error"])}
        lines = [line for line in proc.stderr.splitlines() if line.startswith("Error:")] or proc.stderr.splitlines()
        return {"error": lines[-1].removeprefix("Error: ") if lines else f"merge exited {proc.returncode}"}
    return doc if isinstance(doc, dict) else {"error": f"merge printed no result: {proc.stdout[-200:]!r}"}


__all__ = ["merge", "merge_in_child", "merge_adapter", "merged_path", "check_adapter_folder", "MergeResult", "MERGED_SUFFIX"]
