"""DPO planned (launcher side): what a ``--method dpo`` run is, refused where it cannot run.

* :func:`plan` (the method's ``plan`` entry point) -> a :class:`~trnqwen.methods.base.MethodPlan`;
* :func:`spec_from_config` -> :class:`DpoSpec` (beta, loss type), or None for SFT;
* :func:`check` refuses what has no DPO here (nki-moe; a stream torchtitan reads itself);
* :func:`reference_key` names the starting weights and everything that changes their numbers,
  so the reference pass (``methods/dpo/reference_pass.py``) runs once per (weights, cache, layout) and a
  resumed run finds its own (``dataset/reference.py`` stores it with the token cache);
* :func:`render_lines` is the config module's part: the loss and the dataloaders' reference folder.

The step-1 check belongs to the judge (``methods/dpo/judge.py``): before any update the policy is the
reference, so the first loss is :func:`initial_loss` (ln 2 for sigmoid),
and a run that starts elsewhere compared itself with another model's log-probs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trnqwen.config import RunConfig
from trnqwen.dataset.cache import RankData
from trnqwen.methods.base import MethodPlan
from trnqwen.methods.dpo.settings import LOSS_TYPES  # noqa: F401  (the loss types' one home)
from trnqwen.methods.pair_plan import refuse_unsupported, rows_lines

REFERENCE_IMPORT = "from trnqwen.methods.dpo.titan import dpo_loss_config"
ROWS = "trnqwen.methods.dpo.loss:titan_rows"  # the torchtitan dataloaders' row reader (methods/dpo/loss.py)


def initial_loss(loss_type: str, beta: float) -> float:
    """Every pair's loss before the first update (policy = reference): the one home of the formula
    (the ranks, the judge and the quickstart all ask here)."""
    return math.log(2.0) if loss_type == "sigmoid" else (1.0 / (2.0 * beta)) ** 2


@dataclass(frozen=True)
class DpoSpec:
    beta: float = 0.1
    loss_type: str = "sigmoid"

    @property
    def initial_loss(self) -> float:
        return initial_loss(self.loss_type, self.beta)


def spec_from_config(cfg: RunConfig) -> Optional[DpoSpec]:
    if getattr(cfg, "method", "sft") != "dpo":
        return None
    return DpoSpec(beta=float(cfg.beta), loss_type=str(cfg.dpo_loss))


def check(cfg: RunConfig) -> None:
    """Refuse a DPO run that cannot be one, with what to do instead."""
    if getattr(cfg, "method", "sft") == "dpo":
        refuse_unsupported(cfg, "dpo")


def weights_identity(cfg: RunConfig, assets_dir: Path) -> dict[str, Any]:
    """What the starting weights are: the checkpoint files (name, size, mtime, header) for a
    fine-tune, the seed and model config for a random init.  Cheap: each file's first MiB (its
    header and first tensors), never all of it."""
    assets_dir = Path(assets_dir)
    config_text = (assets_dir / "config.json").read_text() if (assets_dir / "config.json").is_file() else ""
    if not cfg.finetune:
        return {"init": "random", "seed": cfg.seed, "config": config_text}
    files = []
    for path in sorted(assets_dir.glob("*.safetensors")):
        stat = path.stat()
        with path.open("rb") as fh:
            head = hashlib.sha256(fh.read(1 << 20)).hexdigest()
        files.append([path.name, stat.st_size, stat.st_mtime_ns, head])
    return {"init": "checkpoint", "files": files, "config": config_text}


def reference_key(cfg: RunConfig, assets_dir: Path, *, device_type: str, versions: dict[str, str]) -> str:
    """sha256 of the starting weights and of what changes the numbers computed from them.

    Not the data-parallel layout or batch size: they change the last bits only (the batch a row
    is computed in), and a resumed run may change its rank count and must find its own reference."""
    identity = {
        "weights": weights_identity(cfg, assets_dir),
        "backend": cfg.backend,
        "device": device_type,
        "tp": cfg.tp,
        "lora": [cfg.lora_targets] if cfg.lora else None,  # native LoRA builds q/k/v unfused
        "compile": cfg.compile,
        "versions": versions,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def render_lines(spec: DpoSpec, reference_dir: Path, *, validates: bool) -> tuple[list[str], list[str]]:
    """(imports, config-function lines): DPO's loss and where the dataloaders find the reference."""
    ref = str(reference_dir)
    lines = [
        "# DPO: the loss of the pairs against reference log-probs computed once from these starting",
        "# weights, before step 1 (trnqwen.methods.dpo.reference_pass), kept with the token cache.",
        f"config.loss = dpo_loss_config(beta={spec.beta!r}, loss_type={spec.loss_type!r}, reference_dir={ref!r})",
        f"config.dataloader.reference_dir = {ref!r}",
        *rows_lines(ROWS, validates=validates),
    ]
    if validates:
        lines.append(f"config.validator.dataloader.reference_dir = {ref!r}")
    return [REFERENCE_IMPORT], lines


def plan_note(spec: DpoSpec, reference_dir: Path, *, reused: bool) -> str:
    how = "reused from an earlier run" if reused else "computed before step 1"
    return (f"DPO: beta {spec.beta:g}, {spec.loss_type} loss (step-1 loss {spec.initial_loss:.6f}); "
            f"reference log-probs {how} ({reference_dir})")


def plan(cfg: RunConfig, assets_dir: Path, rank_data: Optional[RankData], *, device_type: str, dp_degree: int, steps: int,
         validates: bool) -> Optional[MethodPlan]:
    """The plan of a DPO run (refusals raise); None without a token cache (nothing to plan yet)."""
    check(cfg)
    spec = spec_from_config(cfg)
    if spec is None or rank_data is None:
        return None
    from trnqwen.dataset import reference
    from trnqwen.env.versions import package_versions

    key = reference_key(cfg, assets_dir, device_type=device_type,
                        versions=package_versions(("torch", "torchtitan", "transformers")))
    directory = reference.reference_dir(rank_data.cache_dir, key)
    rows_per_step = cfg.global_batch_size or cfg.local_batch_size * dp_degree  # the rows one step reads
    needed = {"train": reference.prefix_rows(rank_data.train_rows, steps, rows_per_step)}
    if validates:
        needed["val"] = rank_data.val_rows
    imports, lines = render_lines(spec, directory, validates=validates)
    return MethodPlan(
        method="dpo", spec=spec, imports=[*imports, "from trnqwen.methods.dpo.titan import DPOHook"],
        config_lines=lines, hooks=["DPOHook()"],  # its batch fields, reference pass, [DPO] lines and values
        settings={"beta": spec.beta, "loss_type": spec.loss_type, "reference_dir": str(directory)},
        note=plan_note(spec, directory, reused=reference.is_complete(directory, needed)),
    )
