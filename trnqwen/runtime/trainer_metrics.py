"""trnqwen's torchtitan metrics processor: torchtitan's step line and writers, plus the LR on the
step line, the trainer hooks' values and the metrics stream.

:func:`trnqwen.runtime.trainer.trnqwen_config` puts :class:`TrnqwenMetricsProcessor.Config` in
``config.metrics``; ``Trainer.__init__`` builds this class and trnqwen's trainer then
:meth:`~TrnqwenMetricsProcessor.attach`\\ es itself and its hooks.  Each logged step (every rank
calls ``log``; torchtitan reduces the loss across ranks first):

1. every hook's ``step_values(trainer, "train")`` (on every rank: a hook may all-reduce), named
   ``<hook name>/<value>`` (``<method>/margin``), join torchtitan's extra metrics (TensorBoard/W&B);
2. torchtitan prints its step line, with ``  lr: <value>`` appended (:mod:`trnqwen.runtime.lr_log`);
3. every hook's ``log_lines(step, "train")`` follow it (``[<METHOD>] step: ...``);
4. global rank 0 appends one ``step`` record to the metrics stream
   (:mod:`trnqwen.contract.metrics_stream`, the file named by ``TRNQWEN_METRICS_PATH``):
   loss, grad_norm, memory_gib, memory_pct, tps, tflops, mfu (None where torchtitan has none), lr
   and the hooks' named values.

``log_validation`` does the same with mode ``"val"`` (TensorBoard names ``validation_metrics/<name>``)
and writes one ``validation`` record (loss, memory_gib, memory_pct, tps and the hooks' values).
The text log stays as it was: for people, and for the parser of logs trnqwen did not write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Optional

import tyro

from torchtitan.components.metrics import LoggerContainer, MetricsProcessor
from torchtitan.tools.logging import logger

from trnqwen.contract.metrics_stream import MetricsWriter, as_number
from trnqwen.runtime import lr_log
from trnqwen.runtime.trainer_parts import TrainerAttached, as_trnqwen_config

UNNAMED_BACKEND = "torchtitan"  # the stream header's backend when the config module names none (a hand-written one)


class _Capture:
    """torchtitan's metric writers (TensorBoard/W&B container), keeping the last dict they got."""

    def __init__(self, inner: LoggerContainer) -> None:
        self.inner = inner
        self.last: dict[str, Any] = {}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.last = dict(metrics)
        self.inner.log(metrics, step)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TrnqwenMetricsProcessor(TrainerAttached, MetricsProcessor):
    """torchtitan's MetricsProcessor with the hooks' values, the LR and the stream (module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        backend: Annotated[str, tyro.conf.Suppress] = ""
        """trnqwen's backend of the run (native, hf-v5, nki-moe): the metrics stream's header names it."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.logger = _Capture(self.logger)
        self.stream = MetricsWriter.from_env()
        self._header = False

    def _hook_values(self, mode: str) -> list[tuple[Any, dict[str, float]]]:
        out = []
        for hook in self.hooks:
            values = hook.step_values(self.trainer, mode)
            if values:
                out.append((hook, dict(values)))
        return out

    def _hook_lines(self, per_hook: list[tuple[Any, dict[str, float]]], step: int, mode: str) -> None:
        for hook, _values in per_hook:
            for line in hook.log_lines(step, mode):
                logger.info(line)

    def _write(self, kind: str, step: int, values: dict[str, Optional[float]]) -> None:
        if not self.stream.enabled:
            return
        if not self._header:
            self._header = True
            methods = [h.name for h in self.hooks if getattr(h, "method", False)]
            meta = {
                "backend": self.config.backend or UNNAMED_BACKEND,
                "method": methods[0] if methods else "sft",
                "metrics": {f"{h.name}/{k}": text for h in self.hooks for k, text in h.describe().items()},
            }
            self.stream.write("header", step, {}, meta=meta)
        self.stream.write(kind, step, values)

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        per_hook = self._hook_values("train")
        named = {f"{hook.name}/{k}": v for hook, values in per_hook for k, v in values.items()}
        if named:
            extra_metrics = {**(extra_metrics or {}), **named}
        lr = lr_log.learning_rate(extra_metrics)
        with lr_log.appended_to_step_line(lr):
            out = super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        self._hook_lines(per_hook, step, "train")
        m = self.logger.last
        self._write("step", step, {
            "loss": as_number(global_avg_loss),
            "grad_norm": as_number(grad_norm),
            "memory_gib": as_number(m.get("memory/max_reserved(GiB)")),
            "memory_pct": as_number(m.get("memory/max_reserved(%)")),
            "tps": as_number(m.get("throughput(tps)")),
            "tflops": as_number(m.get("tflops")),
            "mfu": as_number(m.get("mfu(%)")),
            "lr": lr,
            **{k: as_number(v) for k, v in named.items()},
        })
        return out

    def log_validation(self, loss, step, extra_metrics=None):
        per_hook = self._hook_values("val")
        named = {f"{hook.name}/{k}": v for hook, values in per_hook for k, v in values.items()}
        if named:
            extra_metrics = {**(extra_metrics or {}), **{f"validation_metrics/{k}": v for k, v in named.items()}}
        out = super().log_validation(loss, step, extra_metrics=extra_metrics)
        self._hook_lines(per_hook, step, "val")
        m = self.logger.last
        self._write("validation", step, {
            "loss": as_number(loss),
            "memory_gib": as_number(m.get("validation_metrics/memory/max_reserved(GiB)")),
            "memory_pct": as_number(m.get("validation_metrics/memory/max_reserved(%)")),
            "tps": as_number(m.get("validation_metrics/throughput(tps)")),
            **{k: as_number(v) for k, v in named.items()},
        })
        return out

    def close(self):
        try:
            super().close()
        finally:
            self.stream.close()


def metrics_config(base: MetricsProcessor.Config, *, backend: Optional[str] = None) -> TrnqwenMetricsProcessor.Config:
    """torchtitan's metrics config as trnqwen's (the same values); kept when already one.
    ``backend``: the run's (the stream's header names it)."""
    config = as_trnqwen_config(base, TrnqwenMetricsProcessor.Config, titan_cls=MetricsProcessor.Config, where="metrics")
    if backend:
        config.backend = backend
    return config
