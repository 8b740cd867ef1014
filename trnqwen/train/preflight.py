"""Checks before a run spends minutes starting ranks and compiling.

:func:`preflight` returns a :class:`PreflightReport` (findings with a severity); errors stop the
run (:meth:`PreflightReport.raise_for_errors`), warnings are printed.  Everything here reads
files and does arithmetic: no torch, no device runtime.

Checks: assets present and complete (config.json, tokenizer files, safetensors shards when
fine-tuning), seq_len a multiple of 128 x LNC when an NKI RoPE override is requested, batch sizes
consistent with the ranks (global = local x dp x gradient-accumulation steps), ranks not above
the devices present, and a per-rank memory estimate against the device's memory.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trnqwen import assets
from trnqwen.errors import CheckFailed, UsageError
from trnqwen.fsutil import free_bytes
from trnqwen.train.topology import PARALLELISM, Topology
from trnqwen.units import format_bytes

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.job import TrainJob

ERROR = "error"
WARNING = "warning"
INFO = "info"

GIB = 1024**3
NKI_ROPE_TILE = 128
MEMORY_WARN_FRACTION = 0.9


@dataclass
class Finding:
    severity: str  # error | warning | info
    check: str  # assets | seq_len | batch | ranks | memory | ...
    message: str
    hint: Optional[str] = None


@dataclass
class MemoryEstimate:
    """Bytes per rank; an upper-ish estimate without activation checkpointing."""

    params: int
    grads: int
    optimizer: int
    activations: int
    logits: int
    gathered: int  # FSDP all-gathered layer parameters in flight (bf16, prefetch of two layers)
    capacity: Optional[int] = None
    num_params: Optional[int] = None
    shards: int = 1

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.logits + self.gathered

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["total"] = self.total
        return out

    def describe(self) -> str:
        parts = (
            f"params {_size(self.params)} + grads {_size(self.grads)} + AdamW m+v {_size(self.optimizer)} + "
            f"activations {_size(self.activations)} + logits {_size(self.logits)} + all-gathered {_size(self.gathered)}"
        )
        cap = f" of {_size(self.capacity)}" if self.capacity else ""
        return f"~{_size(self.total)} per rank{cap} ({parts})"


def _size(n: int) -> str:
    return format_bytes(n, digits=2 if n >= GIB else 1, smallest="MiB", largest="GiB")


@dataclass
class PreflightReport:
    findings: list[Finding] = field(default_factory=list)
    memory: Optional[MemoryEstimate] = None
    dp: Optional[int] = None
    grad_accum_steps: Optional[int] = None
    world_size: Optional[int] = None

    def add(self, severity: str, check: str, message: str, hint: Optional[str] = None) -> None:
        self.findings.append(Finding(severity, check, message, hint))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [asdict(f) for f in self.findings],
            "memory": self.memory.as_dict() if self.memory else None,
            "world_size": self.world_size,
            "dp": self.dp,
            "grad_accum_steps": self.grad_accum_steps,
        }

    def raise_for_errors(self) -> None:
        """One clear error for everything that stops the run (usage problems exit 2)."""
        errors = self.errors
        if not errors:
            return
        message = "preflight: " + "; ".join(f.message for f in errors)
        hints = [f.hint for f in errors if f.hint]
        cls = UsageError if all(f.check in USAGE_CHECKS for f in errors) else CheckFailed
        raise cls(message, hint="; ".join(dict.fromkeys(hints)) or None)


USAGE_CHECKS = {"assets", "seq_len", "batch", "ranks", "parallelism", "dataset", "outputs"}


# --- the checks ---------------------------------------------------------------------------


def check_assets(report: PreflightReport, cfg: Any, assets_dir: Path) -> Optional[dict[str, Any]]:
    """config.json, tokenizer files, and (fine-tuning) every safetensors shard (:mod:`trnqwen.assets`)."""
    fetch_hint = f"run `trnqwen fetch {cfg.model}` or pass --assets DIR with the model's HF files"
    for problem in assets.folder_problems(assets_dir, weights=bool(cfg.finetune)):
        report.add(ERROR, "assets", problem.message, fetch_hint + problem.alternative)
    return assets.read_config_json(assets_dir)


def wants_nki_rope(override_imports: list[str]) -> bool:
    return any(("rope" in t.lower() or "nki" in t.lower()) for t in override_imports)


def check_seq_len(report: PreflightReport, cfg: RunConfig, device: DeviceInfo) -> None:
    if not wants_nki_rope(list(cfg.override_imports or [])):
        return
    lnc = int(cfg.lnc or device.lnc or 2)
    tile = NKI_ROPE_TILE * lnc
    if cfg.seq_len % tile:
        lower = max(tile, cfg.seq_len // tile * tile)
        report.add(
            ERROR,
            "seq_len",
            f"seq_len {cfg.seq_len} is not a multiple of {tile} (128 x LNC {lnc}), which the NKI RoPE kernel requires",
            f"use --seq-len {lower} or {lower + tile}",
        )


def check_topology(report: PreflightReport, topo: Topology) -> None:
    """The degrees cover the ranks and the global batch splits over them (rules: :mod:`.topology`)."""
    report.world_size = topo.world_size
    report.dp = topo.dp
    for problem in topo.problems:
        report.add(ERROR, problem.check, problem.message, problem.hint)
    for warning in topo.warnings:
        report.add(WARNING, PARALLELISM, warning)
    if topo.problems:
        return
    report.grad_accum_steps = topo.grad_accum_steps
    if topo.grad_accum_steps > 1:
        per_step = topo.local_batch_size * topo.dp
        report.add(
            INFO,
            "batch",
            f"global batch {topo.global_batch_size} = {per_step} per micro-step x {topo.grad_accum_steps} "
            "gradient-accumulation steps",
        )


def check_ranks(report: PreflightReport, device: DeviceInfo, nproc_per_node: int) -> None:
    dtype = device.type
    count = int(device.count or 1)
    if dtype in ("neuron", "cuda") and nproc_per_node > count:
        unit = "logical NeuronCores" if dtype == "neuron" else "GPUs"
        report.add(
            ERROR,
            "ranks",
            f"{nproc_per_node} ranks per node, but this machine has {count} {unit}",
            f"use --nproc-per-node {count} or fewer",
        )
    if dtype == "cpu":
        cpus = os.cpu_count() or 1
        if nproc_per_node > cpus:
            report.add(
                WARNING,
                "ranks",
                f"{nproc_per_node} CPU ranks on {cpus} cores will be slow (ranks share cores)",
            )


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and not path.is_symlink() and path.parent != path:
        path = path.parent
    return path


def check_outputs(report: PreflightReport, cfg: RunConfig, job: TrainJob) -> None:
    """The run dir and the checkpoint folder can be created and written: a file in the way, a
    read-only mount or too little disk for the export is found now, not after minutes of training."""
    targets = [("runs dir", Path(cfg.runs_dir).expanduser().absolute(), "runs_dir in trnqwen.toml")]
    if job.checkpoint_dir:
        targets.append(("checkpoint folder", Path(job.checkpoint_dir).expanduser().absolute(), "--checkpoint-dir"))
    for label, path, flag in targets:
        if path.is_symlink() and not path.exists():
            report.add(ERROR, "outputs", f"{label} {path} is a broken symbolic link or a symlink loop", f"fix it or pass another {flag}")
            continue
        if path.exists() and not path.is_dir():
            report.add(ERROR, "outputs", f"{label} {path} exists and is not a folder", f"pass another {flag}")
            continue
        base = _nearest_existing(path)
        if not base.is_dir():
            report.add(ERROR, "outputs", f"cannot create {label} {path}: {base} is not a folder", f"pass another {flag}")
            continue
        if not os.access(base, os.W_OK | os.X_OK):
            report.add(ERROR, "outputs", f"cannot write {label} {path}: {base} is read-only", f"pick a writable folder with {flag}")
            continue
        num_params = job.num_params
        if label == "checkpoint folder" and num_params:
            need = 2 * 2 * int(num_params)  # bf16 export: per-rank pieces under sharded/ + the consolidated files
            _, free = free_bytes(base)
            if free is not None and free < need:
                report.add(
                    WARNING, "outputs",
                    f"only {_size(free)} free at {base}; the HF export of the last step needs about {_size(need)}",
                    "free disk space or pass --checkpoint-dir on a bigger disk",
                )


# --- memory ---------------------------------------------------------------------------------


def count_params(dims: Any) -> int:
    """Parameters of a Qwen3 (dense or MoE) from its dims (embeddings, attention, FFN, norms)."""
    h, hd = dims.dim, dims.head_dim
    attn = h * dims.n_heads * hd + 2 * h * dims.n_kv_heads * hd + dims.n_heads * hd * h + 2 * hd
    if dims.num_experts:
        ffn = dims.num_experts * 3 * h * (dims.moe_ffn_dim or 0) + h * dims.num_experts
    else:
        ffn = 3 * h * (dims.ffn_dim or 4 * h)
    per_layer = attn + ffn + 2 * h
    embed = dims.vocab_size * h * (1 if dims.tied else 2)
    return dims.n_layers * per_layer + embed + h


def estimate_memory(
    dims: Any,
    cfg: RunConfig,
    dp: int,
    *,
    capacity: Optional[int] = None,
    num_params: Optional[int] = None,
) -> MemoryEstimate:
    """Per-rank bytes under FSDP (``dp_shard``) x TP, AdamW, no activation checkpointing.

    * parameters fp32 (4 B), gradients fp32 (4 B), AdamW m + v fp32 (8 B): sharded over
      FSDP x TP ranks;
    * activations: ~34 bytes x seq x batch x hidden per layer in bf16 (the Megatron estimate
      with fused attention), split by TP (sequence parallel);
    * logits + their gradient in fp32 (vocab x seq x batch x 8 B), split by TP;
    * parameters of two layers all-gathered in bf16 at a time (FSDP prefetch).
    """
    n = int(num_params or count_params(dims))
    shards = max(1, dp * cfg.tp)
    params = 4 * n // shards
    tokens = cfg.seq_len * cfg.local_batch_size
    activations = 34 * tokens * dims.dim * dims.n_layers // cfg.tp
    logits = 8 * tokens * dims.vocab_size // cfg.tp
    per_layer = max(0, n - dims.vocab_size * dims.dim * (1 if dims.tied else 2)) // max(1, dims.n_layers)
    gathered = 2 * 2 * per_layer // cfg.tp if shards > 1 else 0
    return MemoryEstimate(
        params=params,
        grads=params,
        optimizer=2 * params,
        activations=activations,
        logits=logits,
        gathered=gathered,
        capacity=capacity,
        num_params=n,
        shards=shards,
    )


def _dims_for(cfg: RunConfig, hf_config: dict[str, Any]) -> Any:
    from trnqwen.train.compat import FlavorDims, dims_from_hf_config

    dims = dims_from_hf_config(hf_config)
    if cfg.backend == "nki-moe":
        # The recipe cuts the MoE model to moe_layers layers and num_experts experts.
        dims = FlavorDims(**{**asdict(dims), "n_layers": cfg.moe_layers, "num_experts": cfg.num_experts, "top_k": cfg.top_k})
    return dims


def check_memory(
    report: PreflightReport,
    cfg: RunConfig,
    device: DeviceInfo,
    dp: int,
    hf_config: Optional[dict[str, Any]],
    num_params: Optional[int] = None,
) -> None:
    if not hf_config:
        return
    try:
        dims = _dims_for(cfg, hf_config)
    except (KeyError, TypeError, ValueError):
        report.add(WARNING, "memory", "cannot estimate memory: config.json lacks the usual Qwen3 fields")
        return
    capacity = device.memory_bytes_per_rank
    if cfg.backend == "nki-moe":
        num_params = None  # the job's count is the cut model's only if the recipe says so
    est = estimate_memory(dims, cfg, dp, capacity=capacity, num_params=num_params)
    report.memory = est
    if capacity and est.total > MEMORY_WARN_FRACTION * capacity:
        report.add(
            WARNING,
            "memory",
            f"estimated {est.describe()} will likely not fit",
            "lower --seq-len or --local-batch-size, raise --tp, or use more ranks",
        )
    else:
        report.add(INFO, "memory", f"estimated {est.describe()}")


def preflight(
    cfg: RunConfig, device: DeviceInfo, job: TrainJob, topo: Topology, *, assets_dir: Optional[Path] = None
) -> PreflightReport:
    """Run every check; nothing is started and nothing heavy is imported."""
    report = PreflightReport()
    hf_config = check_assets(report, cfg, Path(assets_dir or cfg.resolved_assets_dir))
    check_seq_len(report, cfg, device)
    check_topology(report, topo)
    check_ranks(report, device, topo.nproc_per_node)
    check_outputs(report, cfg, job)
    if topo.problem(PARALLELISM) is None:
        check_memory(report, cfg, device, topo.dp, hf_config, job.num_params)
    return report
