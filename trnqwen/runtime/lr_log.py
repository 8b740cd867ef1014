"""Inside torchtitan ranks: the learning rate at the end of each step line.

torchtitan 0.3.0 logs the LR of each step only to TensorBoard/W&B (``lr/<optimizer>`` in the
metrics passed to ``MetricsProcessor.log``); its console line has no LR.  trnqwen's metrics
processor (:mod:`trnqwen.runtime.trainer_metrics`) runs torchtitan's ``log`` inside
:func:`appended_to_step_line`: while it runs, a filter on torchtitan's logger appends
``  lr: <value>`` (:func:`trnqwen.contract.stepline.lr_text`) to the step line it prints.  The value is
the one the step trained with (torchtitan reads it before ``optimizer.step()``), as the Trainer
backend prints it, so every backend's log carries the same column.  Only ranks import this.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Optional


class _AppendLR(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "step:" in message and "loss:" in message and "validate" not in message:
            record.msg, record.args = message + self.text, ()
        return True


def learning_rate(extra_metrics: Optional[dict]) -> Optional[float]:
    """The step's learning rate among torchtitan's extra metrics (``lr/<optimizer>``), None if absent."""
    lrs = [v for k, v in (extra_metrics or {}).items() if k.startswith("lr/")]
    return float(lrs[0]) if lrs else None


@contextmanager
def appended_to_step_line(lr: Optional[float]) -> Iterator[None]:
    """While torchtitan prints the step line, it ends with ``  lr: <value>`` (nothing without an LR)."""
    if lr is None:
        yield
        return
    from torchtitan.tools.logging import logger

    from trnqwen.contract.stepline import lr_text

    appender = _AppendLR(lr_text(lr))
    logger.addFilter(appender)
    try:
        yield
    finally:
        logger.removeFilter(appender)
