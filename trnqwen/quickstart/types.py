"""The quickstart's settings, its result types and its progress lines."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.adapters.lora import quickstart as lora_quickstart
from trnqwen.errors import CheckFailed

DEFAULT_WORKDIR = Path("trnqwen-quickstart")
MARKER = ".trnqwen-quickstart"
FINETUNE_BACKENDS: tuple[str, ...] = ("native", "hf-v5", "hf-trainer")
PRETRAIN_BACKEND = "native"
DEFAULT_PRETRAIN_STEPS = 20
DEFAULT_FINETUNE_STEPS = 3
DEFAULT_SEQ_LEN = 256
DEFAULT_LOCAL_BATCH = 2
OVERRIDE_EXAMPLE = "torch_rope_override.torch_rope"  # examples/torch_rope, the NKI example's CPU twin
OVERRIDE_LOSS_TOLERANCE = 1e-5  # the same weights and data through the twin: the same losses
PRETRAIN_LR = 5e-3
FINETUNE_LR = 1e-3
# The fine-tunes must keep at least this share of what pre-training took off the loss
# (a fine-tune whose weights did not load starts back at the random-init loss).
KEEP_FRACTION = 0.5
# Pre-training must lower the loss by at least this much (nats) to count as having learned.
MIN_PRETRAIN_DROP = 0.5
SUMMARY_FILE = "summary.json"
PLOT_FILE = "loss.png"

LORA_STAGE = lora_quickstart.STAGE


def method_stage_names() -> list[str]:
    """Each training method's own stage (``trnqwen/methods/<name>/quickstart.py``'s ``STAGE``), in registry order."""
    from trnqwen.methods import registry as methods

    return [methods.load(m.quickstart).STAGE for m in methods.methods() if m.quickstart]


def stage_names(backends: tuple[str, ...] = FINETUNE_BACKENDS, method_stages: Optional[list[str]] = None) -> list[str]:
    """Every stage the quickstart runs, in their documented order: their numbers, the order of the
    result's stages, the list in ``trnqwen quickstart --help`` and docs/getting-started.md's table."""
    methods_own = method_stage_names() if method_stages is None else method_stages
    return ["check-env", "fetch", "pre-train", "snapshot", *[f"train --finetune ({b})" for b in backends], "override",
            *[f"verify-ckpt ({b})" for b in backends], "inspect-logs", "chat fine-tune", LORA_STAGE, *methods_own]


def stage_groups(backends: tuple[str, ...] = FINETUNE_BACKENDS) -> list[str]:
    """:func:`stage_names` with each per-backend stage once: ``train --finetune (native, hf-v5, hf-trainer)``."""
    out: list[str] = []
    for name in stage_names(backends):
        head, _, backend = name.partition(" (")
        if backend and backend.rstrip(")") in backends:
            name = f"{head} ({', '.join(backends)})"
        if name not in out:
            out.append(name)
    return out


NEXT_COMMANDS = (
    "trnqwen fetch Qwen/Qwen3-4B-Instruct-2507",
    "trnqwen check-env",
    "trnqwen train --backend hf-v5 --finetune --checkpoint-dir checkpoint_qwen3_4b_hf_v5",
    "trnqwen train --backend native --finetune --global-batch-size 64 --checkpoint-dir checkpoint_qwen3_4b_native",
    "trnqwen train --backend hf-trainer --finetune --checkpoint-dir checkpoint_qwen3_4b_hf_trainer",
    "trnqwen verify-ckpt checkpoint_qwen3_4b_native --round-trip",
    "trnqwen inspect-logs --plot loss.png",
)


class StageFailed(CheckFailed):
    """A quickstart stage failed; ``stage`` names it."""

    def __init__(self, stage: str, message: str, *, hint: Optional[str] = None, exit_code: Optional[int] = None):
        super().__init__(f"quickstart stage '{stage}' failed: {message}", hint=hint)
        self.stage = stage
        self.result: Optional["QuickstartResult"] = None
        if exit_code is not None:
            self.exit_code = exit_code


def attach_result(exc: BaseException, result: "QuickstartResult") -> None:
    """Give the exception that stopped the quickstart the result so far (:func:`result_of` reads it)."""
    try:
        exc.quickstart_result = result  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__: no partial report, the error still shows
        pass
    if isinstance(exc, StageFailed):
        exc.result = result


def result_of(exc: BaseException) -> Optional["QuickstartResult"]:
    """The quickstart's result at the moment ``exc`` stopped it, if it carries one."""
    return getattr(exc, "quickstart_result", None)


@dataclass
class Stage:
    name: str
    ok: bool = False
    seconds: float = 0.0
    detail: str = ""
    error: Optional[str] = None
    skipped: Optional[str] = None  # why the stage did not run (it is not a failure)


@dataclass
class RunInfo:
    """One training run of the quickstart."""

    label: str
    backend: str
    finetune: bool
    steps: int
    nproc_per_node: int
    run_dir: Optional[str] = None
    log: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    exported: Optional[str] = None
    status: Optional[str] = None
    wall_s: Optional[float] = None
    step1_loss: Optional[float] = None
    last_loss: Optional[float] = None
    losses: list[Optional[float]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    verify: Optional[dict[str, Any]] = None


@dataclass
class QuickstartResult:
    workdir: str
    device: str
    ok: bool = False
    failed_stage: Optional[str] = None
    error: Optional[str] = None
    seconds: float = 0.0
    stages: list[Stage] = field(default_factory=list)
    runs: dict[str, RunInfo] = field(default_factory=dict)
    comparison: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)  # the chat stage's held-out loss and answers
    lora: dict[str, Any] = field(default_factory=dict)  # the LoRA stage's numbers (trnqwen.adapters.lora.quickstart)
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)  # a method's stage numbers, by method name
    files: dict[str, str] = field(default_factory=dict)
    next_commands: list[str] = field(default_factory=lambda: list(NEXT_COMMANDS))

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("methods"))  # each method's stage numbers under its name (trnqwen.methods.<name>.quickstart)
        return out
