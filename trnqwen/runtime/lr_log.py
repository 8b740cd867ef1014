"""Inside torchtitan ranks: the learning rate at the end of each step line.

torchtitan 0.3.0 logs the LR of each step only to TensorBoard/W&B (``lr/<optimizer>`` in the
metrics passed to ``MetricsProcessor.log``); its console line has no LR.  :func:`install` wraps
``MetricsProcessor.log`` so that, while it runs, a filter on torchtitan's logger appends
``  lr: <value>`` (:func:`trnqwen.contract.stepline.lr_text`) to the step line it prints.  The value is
the one the step trained with (torchtitan reads it before ``optimizer.step()``), as the Trainer
backend prints it, so every backend's log carries the same column.  Only ranks import this.
"""

from __future__ import annotations

import logging


class _AppendLR(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "step:" in message and "loss:" in message and "validate" not in message:
            record.msg, record.args = message + self.text, ()
        return True


def install() -> None:
    from torchtitan.components import metrics
    from torchtitan.tools.logging import logger

    from trnqwen.contract.stepline import lr_text

    original = metrics.MetricsProcessor.log
    if getattr(original, "_trnqwen", False):
        return

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        lrs = [v for k, v in (extra_metrics or {}).items() if k.startswith("lr/")]
        if not lrs:
            return original(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        appender = _AppendLR(lr_text(float(lrs[0])))
        logger.addFilter(appender)
        try:
            return original(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        finally:
            logger.removeFilter(appender)

    log._trnqwen = True  # type: ignore[attr-defined]
    metrics.MetricsProcessor.log = log
