"""What every preference method's plan shares (launcher side: never imports torch): the refusals
of a run that cannot be one, and the torchtitan dataloaders' row reader lines."""

from __future__ import annotations

from trnqwen.config import RunConfig
from trnqwen.errors import UsageError


def refuse_unsupported(cfg: RunConfig, method: str) -> None:
    """Refuse a ``--method <method>`` run that cannot be one here, with what to do instead."""
    if cfg.backend == "nki-moe":
        raise UsageError(
            f"--method {method} runs on hf-v5, native and hf-trainer; nki-moe's kernels are not wired to the "
            f"{method.upper()} loss yet",
            hint="use --backend native for a Qwen3-MoE (docs/moe.md) or a dense model on hf-v5",
        )
    if cfg.train_on_inputs:
        raise UsageError(f"--train-on-inputs has no meaning with --method {method}: only the answers are compared",
                         hint="drop --train-on-inputs")


def rows_lines(rows: str, *, validates: bool) -> list[str]:
    """The config function's lines pointing the dataloaders (and the validator's) at ``rows``, the
    method's row reader (``"module:function"``)."""
    lines = [f"config.dataloader.rows = {rows!r}"]
    if validates:
        lines.append(f"config.validator.dataloader.rows = {rows!r}")
    return lines
