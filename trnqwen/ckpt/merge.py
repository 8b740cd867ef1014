"""Merge a LoRA adapter into its base: a whole model folder that needs no peft.

``W' = W + (alpha / r) * B @ A`` for every adapted module, computed in float32 and cast to the
base tensor's dtype (what peft's ``merge_and_unload`` does); every other tensor is copied as it
is.  Shards keep the base's file names and index, so the folder reads like the published
snapshot; config.json, generation config, tokenizer (with the chat template) and a model card
complete it (:func:`trnqwen.ckpt.model_folder.complete_export`).

Used by ``trnqwen train --lora --merge`` (``hf/step-N.merged`` beside the adapter, which step
scans ignore like ``step-N.sharded``) and by ``trnqwen merge ADAPTER [--base DIR] [--out DIR]``.
The result appears whole or not at all: it is written into a temporary sibling and renamed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import INDEX_NAME
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


def merge_adapter(adapter: Path, base: Path, out: Optional[Path] = None, *, card_info: Optional[CardInfo] = None) -> MergeResult:
    """Write base + adapter as one model folder at ``out`` (default ``<adapter>.merged``)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from trnqwen.contract.peft_adapter import is_adapter_folder, read_adapter
    from trnqwen.ckpt.model_folder import complete_export

    started = time.perf_counter()
    adapter, base = Path(adapter).absolute(), Path(base).absolute()
    if not is_adapter_folder(adapter):
        raise UsageError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)",
                         hint="pass the hf/step-N folder a --lora run exported")
    if not (base / "config.json").is_file():
        raise UsageError(f"{base} is not a model folder (no config.json)", hint="pass the base snapshot with --base")
    out = Path(out).absolute() if out is not None else merged_path(adapter)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already exists and is not empty", hint="remove it, or pass another --out")
    config, modules = read_adapter(adapter)
    scaling = float(config["lora_alpha"]) / float(config["r"])
    pending = {f"{module}.weight": ab for module, ab in modules.items()}
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
                    ab = pending.pop(key, None)
                    if ab is not None:
                        a, b = (t.to(torch.float32) for t in ab)
                        if (b.shape[0], a.shape[1]) != tuple(weight.shape):
                            raise CheckFailed(
                                f"{key}: the adapter's update is {b.shape[0]}x{a.shape[1]} but the base weight is "
                                f"{'x'.join(map(str, weight.shape))}: this adapter was not trained on this base",
                                hint="pass the base the run started from with --base",
                            )
                        weight = (weight.to(torch.float32) + scaling * (b @ a)).to(weight.dtype)
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
        info = card_info or CardInfo(base_model=str(config.get("base_model_name_or_path") or base.name), backend="merge")
        info.adapter = None
        files = complete_export(tmp, base, info)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return MergeResult(out=out, base=base, adapter=adapter, merged_modules=len(modules), tensors=tensors,
                       seconds=time.perf_counter() - started, files=sorted(p.name for p in out.iterdir()) or files)


def base_of_adapter(adapter: Path, *, runs_dir: Optional[Path] = None) -> Optional[Path]:
    """The base snapshot an adapter was trained on: the assets of the run that exported it, else
    adapter_config's ``base_model_name_or_path`` when that is a local folder or a fetched model."""
    from trnqwen.contract.peft_adapter import read_adapter_config
    from trnqwen.config import RunConfig
    from trnqwen.rundir import recent_records

    adapter = Path(adapter).absolute()
    for _run_dir, record in recent_records(runs_dir) if runs_dir is not None else []:
        exported = (record.extra or {}).get("exported")
        if exported and Path(exported).absolute() == adapter and record.assets_dir:
            return Path(record.assets_dir)
    name = str(read_adapter_config(adapter).get("base_model_name_or_path") or "")
    if not name:
        return None
    local = Path(name).expanduser()
    if (local / "config.json").is_file():
        return local.absolute()
    guess = RunConfig(model=name if "/" in name else f"builtin:{name}").resolved_assets_dir
    return guess.absolute() if (guess / "config.json").is_file() else None


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
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"merge exited {proc.returncode}"}
    return json.loads(proc.stdout)


__all__ = ["merge_in_child", "merge_adapter", "merged_path", "base_of_adapter", "MergeResult", "MERGED_SUFFIX"]
