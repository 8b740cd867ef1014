"""How much disk a run's checkpoints take: preflight compares it with the free space up front.

A run that only finds out at its first save (default every 500 steps) has trained for nothing.
What a checkpoint folder holds at its fullest:

* **resume points** (``resume/step-N``, the Trainer's ``resume/checkpoint-N``): every parameter in
  fp32 (4 B; a tied embedding is stored twice, as the embedding and as the output layer) plus AdamW's
  m and v for the trained ones (8 B; LoRA: the adapters only), DCP's metadata aside.  torchtitan (``keep_latest_k``) and the Trainer (``save_total_limit``) delete the
  oldest only after the newest is written, so ``--keep-last`` k means k + 1 on disk for a moment;
  ``--keep-last 0`` keeps every save (one per ``--save-every`` steps, and the last step).
* **the export** (``hf/step-N``): the model in its checkpoint dtype; the torchtitan backends also keep
  the per-rank pieces they consolidated it from (``hf/step-N.sharded``); a LoRA run exports the
  adapters only, plus the merged model with ``--merge``.

Measured on builtin:tiny-qwen3 (1.05 M parameters, float32, native): a resume point 14.5 MB of
which 13.7 MB tensors (estimate 13.7 MB), with LoRA 8.4 MB (7.1 MB), the export 8.5 MB (8.4 MB);
DCP's own overhead is about 1 MB a file, nothing beside a real model's size.  Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from trnqwen.units import format_bytes

FP32 = 4
ADAMW_STATE = 8  # m and v, fp32
TITAN_EXPORT_COPIES = 2  # hf/step-N and the per-rank pieces in hf/step-N.sharded


@dataclass(frozen=True)
class DiskEstimate:
    resume_point: int  # bytes of one resume point
    resume_points: int  # how many are on disk at the fullest moment
    export: int  # bytes of the last step's export (0: no export)

    @property
    def total(self) -> int:
        return self.resume_point * self.resume_points + self.export

    def describe(self) -> str:
        parts = [f"{self.resume_points} resume point(s) x {_size(self.resume_point)}"]
        if self.export:
            parts.append(f"the export {_size(self.export)}")
        return f"about {_size(self.total)} ({' + '.join(parts)})"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def _size(n: int) -> str:
    return format_bytes(n, digits=1, smallest="MiB", largest="TiB")


def saves(steps: int, save_every: int) -> int:
    """Resume points a run writes: one every ``save_every`` steps, and the last step's."""
    every = max(1, int(save_every))
    return steps // every + (1 if steps % every else 0)


def estimate_disk(
    *, num_params: int, trainable: Optional[int], steps: int, save_every: int, keep_last: int,
    export_dtype_bytes: Optional[int], lora: bool, merge: bool, sharded_export: bool, tied_embedding: int = 0,
) -> DiskEstimate:
    """The checkpoint folder at its fullest (see the module doc).  ``trainable``: parameters with
    AdamW state (None: all); ``export_dtype_bytes``: None when the run exports nothing;
    ``tied_embedding``: the parameters of an embedding tied to the output layer (saved twice)."""
    trained = num_params if trainable is None else int(trainable)
    stored = num_params + tied_embedding + (trained if lora else 0)  # LoRA: the base and the adapters
    point = FP32 * stored + ADAMW_STATE * trained
    written = saves(steps, save_every)
    kept = written if keep_last == 0 else min(written, keep_last + 1)
    export = 0
    if export_dtype_bytes:
        copies = TITAN_EXPORT_COPIES if sharded_export else 1
        if lora:
            export = export_dtype_bytes * trained + (export_dtype_bytes * num_params if merge else 0)
        else:
            export = copies * export_dtype_bytes * num_params
    return DiskEstimate(resume_point=point, resume_points=kept, export=export)
