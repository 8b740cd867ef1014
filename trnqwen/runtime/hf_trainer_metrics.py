"""The hf-trainer backend's numbers: torchtitan's step line and the metrics stream, from one place.

:func:`step_recorder` is the one ``TrainerCallback`` that measures a step (its time, the LR it
trained with) and, on global rank 0, writes it twice: one record in the metrics stream
(:mod:`trnqwen.contract.metrics_stream`, the file the launcher names in ``TRNQWEN_METRICS_PATH``)
and torchtitan's step line on the console (the text log stays).  Both come from the same numbers,
so the line's loss is the record's, rounded.

:func:`metrics_trainer_class` puts the measured values (``tps``, ``tflops``, ``mfu``,
``memory_gib``, ``memory_pct``, ``lr``) into the Trainer's own logs of each step, so its
TensorBoard / W&B writers get every value the stream has.  A method's trainer adds its values to
the same logs named ``<method>/<name>`` (what the stream calls them); every logged name with a
``/`` goes into the step's record as it is, so a new value needs no change here.

A validation (:meth:`StepRecorder.validation`, called by the trainer's ``evaluate`` on rank 0 with
torchtitan's token-weighted loss) prints torchtitan's ``validate step:`` line and writes one
``validation`` record once the evaluation's metrics are known (``on_evaluate``), with the method's
values of that evaluation under the step records' names (``eval_<method>_<name>`` or
``eval_<method>/<name>`` -> ``<method>/<name>``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, Optional

from trnqwen.contract.metrics_stream import MetricsWriter, as_number
from trnqwen.contract.stepline import format_step_line

# What the measured values are called in the Trainer's logs (and in the stream).
MEASURED = ("tps", "tflops", "mfu", "memory_gib", "memory_pct", "lr")


def step_metrics(
    tokens: int, seconds: float, flops_token: int, peak_flops: Optional[float]
) -> tuple[float, float, Optional[float]]:
    """(tokens/s per rank, achieved TFLOP/s per rank, MFU % or None)."""
    tps = tokens / seconds if seconds > 0 else 0.0
    tflops = flops_token * tps / 1e12
    mfu = 100.0 * flops_token * tps / peak_flops if peak_flops else None
    return tps, tflops, mfu


def device_memory(device: str, memory_bytes_per_rank: Optional[int]) -> tuple[Optional[float], Optional[float]]:
    """(peak GiB, % of the rank's memory), None where unknown.  CPU: peak RSS of this process vs.
    host RAM."""
    import torch

    gib = 1024**3
    used: Optional[int]
    if device == "cuda":
        used = torch.cuda.max_memory_reserved()
        total = memory_bytes_per_rank or torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    elif device == "neuron":
        stats = {}
        try:
            stats = torch.neuron.memory_stats()  # type: ignore[attr-defined]
        except Exception:
            pass
        used = int(stats.get("reserved_bytes.all.peak", stats.get("allocated_bytes.all.peak", 0)) or 0) or None
        total = memory_bytes_per_rank or 0
    else:
        import resource

        used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        try:
            import psutil

            total = memory_bytes_per_rank or psutil.virtual_memory().total
        except ImportError:
            total = memory_bytes_per_rank or 0
    if used is None:
        return None, None
    return used / gib, (100.0 * used / total if total else None)


def method_values(logs: Mapping[str, Any]) -> dict[str, Optional[float]]:
    """The ``<method>/<name>`` values of one log call (every name with a ``/``)."""
    return {k: as_number(v) for k, v in logs.items() if "/" in k and as_number(v) is not None}


def _or_zero(value: Optional[float]) -> float:
    return 0.0 if value is None else value


class StepRecorder:
    """Times each optimizer step, writes its stream record and prints its step line (rank 0)."""

    def __init__(self, *, tokens_per_step: int, flops_token: int, peak_flops: Optional[float], device: str,
                 memory_bytes: Optional[int], writer: MetricsWriter, meta: Mapping[str, Any],
                 log: Callable[[str], None], print_line: Callable[[str], None] = print) -> None:
        self.tokens_per_step, self.flops_token, self.peak_flops = tokens_per_step, flops_token, peak_flops
        self.device, self.memory_bytes = device, memory_bytes
        self.writer, self.meta, self.log, self.print_line = writer, dict(meta), log, print_line
        self.started: Optional[float] = None
        self.seconds = 0.0
        self.lr: Optional[float] = None
        self.names: list[str] = []  # the method's value names seen in step logs (validation maps to them)
        self.pending: Optional[tuple[int, dict]] = None  # a validation waiting for its evaluation's metrics

    # -- what the trainer's log() merges into a step's logs ---------------------------------------

    def measured(self) -> dict[str, Optional[float]]:
        tps, tflops, mfu = step_metrics(self.tokens_per_step, self.seconds, self.flops_token, self.peak_flops)
        gib, pct = device_memory(self.device, self.memory_bytes)
        return {"tps": tps, "tflops": tflops, "mfu": mfu, "memory_gib": gib, "memory_pct": pct, "lr": self.lr}

    # -- the callback's events (the Trainer calls them on every rank) ------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.writer.enabled:
            self.writer.write("header", int(state.global_step), {}, meta=self.meta)

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()
        scheduler = kwargs.get("lr_scheduler")  # the LR this step trains with (torchtitan logs the same)
        self.lr = scheduler.get_last_lr()[0] if scheduler is not None else None

    def on_step_end(self, args, state, control, **kwargs):
        if self.started is not None:
            self.seconds = time.perf_counter() - self.started

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs or not state.is_world_process_zero:
            return
        self._flush_validation()
        measured = {k: as_number(logs[k]) if k in logs else v for k, v in self.measured().items()}
        grad_norm = as_number(logs.get("grad_norm"))
        loss = float(logs["loss"])
        extra = method_values(logs)
        self.names = list(dict.fromkeys([*self.names, *extra]))
        values = {"loss": loss, "grad_norm": grad_norm, **measured, **extra}
        self.writer.write("step", int(state.global_step), values)
        self.log(format_step_line(
            state.global_step, loss, math.nan if grad_norm is None else grad_norm, _or_zero(measured["memory_gib"]),
            _or_zero(measured["memory_pct"]), _or_zero(measured["tps"]), _or_zero(measured["tflops"]),
            measured["mfu"], lr=measured["lr"]))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.pending is None:
            return
        step, values = self.pending
        metrics = metrics or {}
        for name in self.names:  # the evaluation's values of the method, under the step records' names
            for key in (f"eval_{name}", "eval_" + name.replace("/", "_")):
                if as_number(metrics.get(key)) is not None:
                    values[name] = as_number(metrics[key])
                    break
        for key, value in metrics.items():  # a name with a "/" that no step logged
            name = key[len("eval_"):] if key.startswith("eval_") else key
            if "/" in name and name not in values and as_number(value) is not None:
                values[name] = as_number(value)
        self.pending = (step, values)
        self._flush_validation()

    def on_train_end(self, args, state, control, **kwargs):
        self._flush_validation()
        self.writer.close()

    # -- validation -------------------------------------------------------------------------------

    def validation(self, step: int, loss: float, tps: float) -> None:
        """A validation's result (rank 0): its ``validate step:`` line now, its record with the
        evaluation's metrics (``on_evaluate``, or the next step / the end when none come)."""
        from trnqwen.runtime.hf_trainer_data import format_validation_line

        self._flush_validation()
        gib, pct = device_memory(self.device, self.memory_bytes)
        self.print_line(format_validation_line(step, loss, _or_zero(gib), _or_zero(pct), tps))
        self.pending = (int(step), {"loss": loss, "memory_gib": gib, "memory_pct": pct, "tps": tps})

    def _flush_validation(self) -> None:
        if self.pending is not None:
            step, values = self.pending
            self.pending = None
            self.writer.write("validation", step, values)


def step_recorder(*, tokens_per_step: int, flops_token: int, peak_flops: Optional[float], device: str,
                  memory_bytes: Optional[int], meta: Mapping[str, Any], log: Callable[[str], None],
                  rank: Optional[int] = None) -> Any:
    """The :class:`StepRecorder` as a ``TrainerCallback``, writing the stream of
    ``TRNQWEN_METRICS_PATH`` on global rank 0 (no stream elsewhere, or without the variable)."""
    from transformers import TrainerCallback

    class Recorder(StepRecorder, TrainerCallback):
        pass

    return Recorder(tokens_per_step=tokens_per_step, flops_token=flops_token, peak_flops=peak_flops, device=device,
                    memory_bytes=memory_bytes, writer=MetricsWriter.from_env(rank), meta=meta, log=log,
                    print_line=lambda line: print(line, flush=True))


def metrics_trainer_class(base: type, recorder: StepRecorder) -> type:
    """``base`` whose step logs carry the recorder's measured values, so the Trainer's own writers
    (TensorBoard, W&B: ``report_to``) log every value of the stream (a value not known, e.g. MFU
    on a CPU, is left out: the writers take numbers only)."""

    class MeasuredLogs(base):
        def log(self, logs, *args, **kwargs):
            if "loss" in logs:
                logs = {**logs, **{k: v for k, v in recorder.measured().items() if v is not None and k not in logs}}
            return super().log(logs, *args, **kwargs)

    return MeasuredLogs
