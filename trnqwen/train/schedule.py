"""The run's schedule, resolved once for every backend: steps (or epochs), LR curve, optimizer, memory.

:func:`resolve_schedule` turns the config and the tokenized cache's size into a :class:`Schedule`:

* **steps**: ``--steps``; else ``--epochs N`` (or one epoch when ``--dataset`` is given) as
  ``floor(ceil(training sequences / global batch) x N)``; else the recipe's 10 steps;
* **learning rate**: ``--lr``, else :func:`trnqwen.config.default_lr` (it says why);
* **warm-up** in steps (a fraction below 1 is of the steps), ``--val-every``/``--save-every epoch``
  in steps.

The LR at each step is :func:`trnqwen.contract.lr_schedule.lr_factor` x the peak LR: torchtitan 0.3.0's
``linear_warmup_stable_decay`` (``torchtitan.components.optimizer.lr_scheduler``), written once
here so the Trainer backend (:mod:`trnqwen.runtime.hf_trainer`) builds its ``LambdaLR`` from the
very same function; torchtitan gets the matching ``lr_scheduler`` settings
(:meth:`Schedule.titan_lr_scheduler`).  Pure Python: the launcher imports it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from trnqwen.config import DEFAULT_SAVE_EVERY, DEFAULT_STEPS, DEFAULT_WARMUP_STEPS, EPOCH, RunConfig, default_lr
from trnqwen.contract.topology import Topology
from trnqwen.dataset.cache import RankData


@dataclass(frozen=True)
class Schedule:
    """What every backend trains with; ``explain`` is how the step count was reached."""

    steps: int
    explain: str
    lr: float
    lr_source: str
    warmup_steps: int
    lr_schedule: str  # cosine | linear | constant
    min_lr_ratio: float
    weight_decay: float
    max_grad_norm: float
    activation_checkpointing: Optional[str]  # None: the backend's own default
    val_every: Optional[int] = None
    save_every: int = 500
    epochs: Optional[float] = None
    sequences: Optional[int] = None  # training sequences in the token cache (None: streamed data)
    global_batch: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    warmup_given: bool = False  # --warmup set by the user (more than the steps is then an error)
    epoch_settings: tuple[str, ...] = ()  # fields set to 'epoch' (they need a dataset)

    @property
    def decay_type(self) -> str:
        return "linear" if self.lr_schedule == "constant" else self.lr_schedule

    @property
    def decay_ratio(self) -> Optional[float]:
        return 0.0 if self.lr_schedule == "constant" else None

    def titan_lines(self) -> list[str]:
        """Lines of the generated torchtitan config function: optimizer, LR scheduler, clipping."""
        return [
            f"config.optimizer = default_adamw(lr={self.lr!r}, weight_decay={self.weight_decay!r})",
            f"config.lr_scheduler.warmup_steps = {min(self.warmup_steps, self.steps)}",
            f"config.lr_scheduler.decay_ratio = {self.decay_ratio!r}",
            f"config.lr_scheduler.decay_type = {self.decay_type!r}",
            f"config.lr_scheduler.min_lr_factor = {self.min_lr_ratio!r}",
            f"config.training.max_norm = {self.max_grad_norm!r}",
        ]

    def summary(self) -> str:
        """One line for the plan: ``412 steps = ...; lr 1e-05 (default for a full fine-tune), cosine ...``."""
        warm = f"{self.warmup_steps} warm-up step{'s' if self.warmup_steps != 1 else ''}"
        curve = f"{self.lr_schedule} decay to {self.lr * self.min_lr_ratio:g}" if self.lr_schedule != "constant" else "then constant"
        return f"{self.explain}; lr {self.lr:g} ({self.lr_source}), {warm}, {curve}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("epoch_settings")
        out.pop("warmup_given")
        out["summary"] = self.summary()
        return out


def resolve_schedule(cfg: RunConfig, *, sequences: Optional[int], global_batch: Optional[int]) -> Schedule:
    """The schedule of ``cfg`` with ``sequences`` training sequences in the cache (None: no cache)."""
    per_epoch = math.ceil(sequences / global_batch) if sequences and global_batch else None
    epochs: Optional[float] = None
    if cfg.steps is not None:
        steps = cfg.steps
        explain = f"{steps:,} steps (--steps)"
        if per_epoch:
            explain += f"; one epoch is {per_epoch:,} steps of {sequences:,} sequences at global batch {global_batch}"
    elif per_epoch is not None:
        epochs = cfg.epochs or 1.0
        steps = math.floor(per_epoch * epochs + 1e-9)
        explain = (f"{steps:,} steps = {epochs:g} epoch{'' if epochs == 1 else 's'} of {sequences:,} sequences "
                   f"at global batch {global_batch}")
        if cfg.epochs is None:
            explain += " (default: one epoch of --dataset)"
    else:
        steps = DEFAULT_STEPS
        explain = f"{steps} steps (default without a dataset)"
        if cfg.epochs is not None:
            explain = f"{steps} steps (--epochs needs a --dataset to count)"
    if cfg.warmup is None:
        warmup = min(DEFAULT_WARMUP_STEPS, steps)
    elif cfg.warmup < 1:
        warmup = math.ceil(cfg.warmup * steps)
    else:
        warmup = int(cfg.warmup)
    lr, lr_source = (cfg.lr, "--lr") if cfg.lr is not None else default_lr(cfg)

    def every(value: Any, default: Optional[int]) -> Optional[int]:
        if value == EPOCH:
            return per_epoch or max(steps, 1)
        return value if value is not None else default

    return Schedule(
        steps=max(steps, 0), explain=explain, lr=lr, lr_source=lr_source, warmup_steps=warmup,
        lr_schedule=cfg.lr_schedule, min_lr_ratio=cfg.min_lr_ratio, weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, activation_checkpointing=cfg.activation_checkpointing,
        val_every=every(cfg.val_every, None), save_every=every(cfg.save_every, None) or DEFAULT_SAVE_EVERY,
        epochs=epochs if epochs is not None else cfg.epochs, sequences=sequences, global_batch=global_batch,
        steps_per_epoch=per_epoch, warmup_given=cfg.warmup is not None,
        epoch_settings=tuple(n for n in ("val_every", "save_every") if getattr(cfg, n) == EPOCH),
    )


def plan_schedule(cfg: RunConfig, rank_data: Optional[RankData], topology: Topology) -> Schedule:
    """The run's schedule from its token cache (:class:`~trnqwen.dataset.cache.RankData`, or None
    for streamed data) and :class:`~trnqwen.contract.topology.Topology`: every backend calls this."""
    known = rank_data is not None and Path(rank_data.cache_dir).is_dir()  # not the tokenized-later placeholder
    gbs = topology.sequences_per_step if topology.ok else (cfg.global_batch_size or cfg.local_batch_size)
    return resolve_schedule(cfg, sequences=rank_data.train_rows if known else None, global_batch=gbs)
