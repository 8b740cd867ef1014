"""A run's method, planned (launcher side, every backend): the cache kind checked, then the
method's own ``plan`` entry point (refusals, the torchtitan config module's lines, the
hf-trainer hooks' settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trnqwen.config import RunConfig
from trnqwen.dataset.cache import RankData
from trnqwen.errors import UsageError
from trnqwen.methods import registry
from trnqwen.methods.base import MethodPlan

DATA_WORDS = {"chat": "SFT rows", "preference": "preference pairs"}


def check_cache(method_name: str, made_for: str, cache_dir: Path) -> None:
    """Refuse a token cache made for another method (``meta.json``'s ``method``)."""
    if made_for == method_name:
        return
    kind = registry.find(made_for)
    what = DATA_WORDS.get(kind.data, f"{made_for} data") if kind else f"{made_for} data"
    raise UsageError(
        f"the token cache {cache_dir} holds {what}, not data for --method {method_name}",
        hint=f"use --method {made_for}, or give the records themselves as --dataset",
    )


def plan_method(cfg: RunConfig, assets_dir: Path, rank_data: Optional[RankData], *, device_type: str, dp_degree: int, steps: int,
                validates: bool) -> Optional[MethodPlan]:
    """The method's plan, or None (a method without one: SFT)."""
    method = registry.of(cfg)
    if rank_data is not None and rank_data.meta:
        check_cache(method.name, rank_data.meta.get("method", registry.DEFAULT), rank_data.cache_dir)
    planner = registry.hook(method, "plan")
    if planner is None:
        return None
    return planner(cfg, assets_dir, rank_data, device_type=device_type, dp_degree=dp_degree, steps=steps,
                   validates=validates)
