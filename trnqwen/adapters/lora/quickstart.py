"""The quickstart's LoRA stage: the chat fine-tune again as a LoRA adapter, judged and merged.

It trains the bundled chat set on the pre-trained snapshot with ``--lora --merge`` (native
backend, the real launcher), then checks what a user would: the ranks' ``[LoRA]`` line counts
only the adapters, the adapter is a small fraction of the base, the held-out loss fell (step 1 is
the base exactly, since every B starts at zero; the last step is base + adapter), and the merged
folder passes verify-ckpt like any export.

The quickstart's own pieces (its ``StageFailed``, its verify-ckpt call, where ``--merge`` writes
the merged folder) are handed in by ``trnqwen/quickstart/stages.py``: an adapter never imports
``quickstart/`` or ``ckpt/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

STAGE = "LoRA fine-tune"
LORA_RANK = 8
LORA_LR = 1e-2  # adapters start at zero and move little per step: LoRA runs 10x a full fine-tune's rate


def lora_settings(chat_settings: dict[str, Any]) -> dict[str, Any]:
    return {**chat_settings, "lr": LORA_LR, "lora": True, "lora_rank": LORA_RANK, "merge": True}


def _folder_bytes(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob(pattern))


def judge_lora_run(log: Optional[str], exported: Optional[str], pretrained: Path, *,
                   verify: Callable[..., dict[str, Any]], fail: Callable[..., Exception],
                   merged_path: Callable[[Path], Path]) -> tuple[str, dict[str, Any]]:
    """(the stage's line, its numbers) of the run that logged to ``log`` and exported ``exported``;
    raises ``fail(stage, message, hint=...)`` (the quickstart's StageFailed) when any check fails.
    ``verify(stage, folder, base, round_trip=...)`` is the quickstart's verify-ckpt,
    ``merged_path(adapter)`` where ``--merge`` wrote the merged folder (``ckpt.merge.merged_path``)."""
    from trnqwen.contract.lora import LOG_LINE_RE
    from trnqwen.contract.stepline import parse_validation_line

    StageFailed = fail
    text = Path(log or "").read_text(encoding="utf-8", errors="replace")
    line = next((m for m in map(LOG_LINE_RE.search, text.splitlines()) if m), None)
    if line is None:
        raise StageFailed(STAGE, "no [LoRA] line in the run's log: the adapters were not built", hint=f"see {log}")
    trainable, total = (int(line[k].replace(",", "")) for k in ("trainable", "total"))
    validations = [v for v in map(parse_validation_line, text.splitlines()) if v and v.get("loss") is not None]
    if len(validations) < 2:
        raise StageFailed(STAGE, "the run logged fewer than two validation losses", hint=f"see {log}")
    before, after = validations[0]["loss"], validations[-1]["loss"]
    if not after < before:
        raise StageFailed(STAGE, f"held-out loss did not fall: {before:.3f} -> {after:.3f}", hint=f"see {log}")
    adapter = Path(exported or "")
    adapter_bytes = _folder_bytes(adapter, "adapter_model.safetensors")
    base_bytes = _folder_bytes(pretrained, "*.safetensors")
    merged = merged_path(adapter)
    checked = verify(STAGE, merged, pretrained, round_trip=True)
    numbers = {"trainable": trainable, "total": total, "adapter_bytes": adapter_bytes, "base_bytes": base_bytes,
               "validation_before": before, "validation_after": after, "merged": str(merged), "merged_verify": checked}
    return (
        f"trainable {trainable:,} of {total:,} ({100 * trainable / total:.1f}%); adapter {adapter_bytes / 1024:.0f} KiB "
        f"vs base {base_bytes / 1024:.0f} KiB; held-out loss {before:.3f} -> {after:.3f}; merged {merged.name} verified",
        numbers,
    )
