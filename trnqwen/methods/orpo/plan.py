"""ORPO planned (launcher side): what a ``--method orpo`` run is, refused where it cannot run.

ORPO is reference-free: no reference pass and no reference folder, so the plan is the loss, the
dataloaders' pair rows and the trainer hook (torchtitan backends), and the hf-trainer hooks'
settings (lambda).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trnqwen.config import RunConfig
from trnqwen.dataset.cache import RankData
from trnqwen.methods.base import MethodPlan
from trnqwen.methods.pair_plan import refuse_unsupported, rows_lines

NAME = "orpo"
IMPORTS = ["from trnqwen.methods.orpo.titan import ORPOHook, orpo_loss_config"]
ROWS = "trnqwen.methods.orpo.loss:titan_rows"  # the torchtitan dataloaders' row reader


@dataclass(frozen=True)
class OrpoSpec:
    lam: float = 0.1


def spec_from_config(cfg: RunConfig) -> Optional[OrpoSpec]:
    if getattr(cfg, "method", None) != NAME:
        return None
    return OrpoSpec(lam=float(cfg.orpo_lambda))


def check(cfg: RunConfig) -> None:
    """Refuse an ORPO run that cannot be one, with what to do instead."""
    if getattr(cfg, "method", None) == NAME:
        refuse_unsupported(cfg, NAME)


def render_lines(spec: OrpoSpec, *, validates: bool) -> list[str]:
    """The config function's lines: ORPO's loss and the dataloaders' pair rows."""
    return [
        "# ORPO: the chosen answers' NLL plus lambda x the odds-ratio term, mean over the step's pairs",
        "# (reference-free: no reference pass).",
        f"config.loss = orpo_loss_config(lam={spec.lam!r})",
        *rows_lines(ROWS, validates=validates),
    ]


def plan(cfg: RunConfig, assets_dir: Path, rank_data: Optional[RankData], *, device_type: str, dp_degree: int, steps: int,
         validates: bool) -> Optional[MethodPlan]:
    """The plan of an ORPO run (refusals raise); None without a token cache (nothing to plan yet)."""
    del assets_dir, device_type, dp_degree, steps
    check(cfg)
    spec = spec_from_config(cfg)
    if spec is None or rank_data is None:
        return None
    return MethodPlan(
        method=NAME, spec=spec, imports=list(IMPORTS), config_lines=render_lines(spec, validates=validates),
        hooks=["ORPOHook()"],  # its batch fields and its values
        settings={"lam": spec.lam},
        note=f"ORPO: lambda {spec.lam:g}, reference-free (the chosen answers' NLL + lambda x the odds-ratio term)",
    )
