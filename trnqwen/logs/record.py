"""What one log says: :class:`ParsedLog`, filled by the streaming engine and the line patterns,
read by the judge and the reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from trnqwen.logs.steps import StepTable

HIGH_MEMORY_PCT = 90.0


@dataclass
class MethodLines:
    """What one training method's own text lines said (the primary rank's): step -> its values
    (and ``line``), the last line of a step winning; note name -> its values (and ``line``)."""

    steps: dict[int, dict] = field(default_factory=dict)
    notes: dict[str, dict] = field(default_factory=dict)


@dataclass
class ParsedLog:
    """Everything read from one log.  Line numbers are 1-based."""

    source: str = ""
    bytes_read: int = 0
    lines: int = 0
    recognized_lines: int = 0
    ends_mid_line: bool = False
    overlong_lines: list[int] = field(default_factory=list)
    invalid_utf8_lines: int = 0
    first_invalid_utf8_line: Optional[int] = None
    nul_bytes: int = 0
    primary_rank: Optional[int] = None
    steps: StepTable = field(default_factory=StepTable)  # step -> record (+ "line"), held as columns
    restarts: list[int] = field(default_factory=list)  # lines where the step counter went back
    resumes: list[dict] = field(default_factory=list)  # [trnqwen] resumed ...: {from_step, line}
    preempted: list[dict] = field(default_factory=list)  # [trnqwen] preempted: ...: {step, signal, line}
    validations: list[dict] = field(default_factory=list)
    overrides: dict[Optional[int], list[dict]] = field(default_factory=dict)  # rank -> override records
    applied: dict[Optional[int], list[tuple[int, int]]] = field(default_factory=dict)  # rank -> [(n, line)]
    override_no_match: list[dict] = field(default_factory=list)
    # [OverrideCalls] lines: name -> rank -> {calls, fallbacks, modules, step, reason, line}
    override_calls: dict[str, dict[int, dict]] = field(default_factory=dict)
    # [LoRA] lines (trnqwen.contract.lora.log_line): rank -> {trainable, total, percent, rank, alpha, dropout,
    # adapters, targets, initialised, line}; None: a line without a torchrun prefix or "(rank R)"
    lora: dict[Optional[int], dict] = field(default_factory=dict)
    # a training method's own lines (trnqwen.contract.method_lines, Method.log_lines): method -> what they said;
    # a validation's line joins its record in ``validations``
    method_lines: dict[str, MethodLines] = field(default_factory=dict)
    # from the run's metrics stream (trnqwen.logs.stream): the values beyond the step line's, by name
    # (the run's method prefix dropped: "<method>/margin" is "margin"), step -> {name: value}
    value_names: list[str] = field(default_factory=list)
    values: dict[int, dict] = field(default_factory=dict)
    metrics_stream: Optional[str] = None  # the stream the steps and validations were read from
    ranks: set = field(default_factory=set)  # ranks seen in prefixes
    world_size_hints: dict[str, int] = field(default_factory=dict)
    model_name: Optional[str] = None
    model_flavor: Optional[str] = None
    model_params: Optional[int] = None
    job_description: Optional[str] = None  # "Starting job: ..." (torchtitan's --job.description)
    vocab_size: Optional[int] = None  # a line that states it (model args, tokenizer)
    num_layers: Optional[int] = None  # a line that states it (model args)
    torchtitan_version: Optional[str] = None
    trainer: dict = field(default_factory=dict)  # local_batch, global_batch, seq_len, steps, warmup
    start_step: Optional[int] = None
    completed_line: Optional[int] = None
    compiled_line: Optional[int] = None  # the first line saying something was compiled (step 1 then includes it)
    ran_out_of_data_line: Optional[int] = None
    checkpoint_events: list[dict] = field(default_factory=list)
    warnings: dict[str, dict] = field(default_factory=dict)  # normalized -> {text, count, line}
    warning_count: int = 0
    errors: list[dict] = field(default_factory=list)  # ERROR-level lines {line, rank, text}
    error_count: int = 0
    tracebacks: dict[Optional[int], dict] = field(default_factory=dict)  # rank -> {first_root, ...}
    torchrun_failure: dict = field(default_factory=dict)
    rank_last_step: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (step, line)
    rank_high_memory: dict[int, dict] = field(default_factory=dict)  # rank -> {pct, gib, step, line}

    @property
    def world_size(self) -> Optional[int]:
        """Best evidence of the rank count: mesh/launcher lines, else the ranks seen."""
        hints = self.world_size_hints
        return next((hints[k] for k in ("mesh", "launcher") if k in hints), max(self.ranks) + 1 if self.ranks else None)

    @property
    def looks_binary(self) -> bool:
        return self.bytes_read > 0 and (self.nul_bytes > max(8, self.bytes_read // 1000) or (
            self.recognized_lines == 0 and self.invalid_utf8_lines > max(1, self.lines // 3)))

    def primary_overrides(self) -> list[dict]:
        """The primary rank's ``[Override]`` records, else the lowest rank's."""
        return self.overrides.get(self.primary_rank if self.primary_rank in self.overrides else first_rank(self.overrides), [])


def first_rank(ranks) -> Optional[int]:
    """The lowest of ``ranks``, the unprefixed stream (None) first; None when there are none."""
    return min(ranks, key=lambda r: -1 if r is None else r, default=None)
