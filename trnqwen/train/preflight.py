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
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trnqwen import assets
from trnqwen.errors import CheckFailed, EnvironmentProblem, UsageError
from trnqwen.fsutil import free_bytes
from trnqwen.titan_compat import FlavorDims
from trnqwen.train.disk import DiskEstimate, estimate_disk
from trnqwen.train.memory import (
    DTYPE_BYTES,
    HostMemoryEstimate,
    MemoryEstimate,
    estimate_host_memory,
    estimate_memory,
)
from trnqwen.train.memory import size as _size
from trnqwen.contract.topology import PARALLELISM, Topology

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.job import TrainJob
    from trnqwen.train.schedule import Schedule

ERROR = "error"
WARNING = "warning"
INFO = "info"
# A fact of the plan, not a finding to act on (memory per rank, seq_len against the context, the
# batch arithmetic): in the --dry-run table and --json on every device, not printed by a real run.
PLAN = "plan"

NKI_ROPE_TILE = 128
MEMORY_WARN_FRACTION = 0.9
# CPU ranks beyond this many per core are refused: they would only thrash (and each holds a
# whole runtime in RAM); up to it, more ranks than cores is a warning.
CPU_RANKS_PER_CORE_LIMIT = 4


@dataclass
class Finding:
    severity: str  # error | warning | info | plan
    check: str  # assets | seq_len | batch | ranks | memory | ...
    message: str
    hint: Optional[str] = None


@dataclass
class PreflightReport:
    findings: list[Finding] = field(default_factory=list)
    memory: Optional[MemoryEstimate] = None
    disk: Optional[DiskEstimate] = None
    host_memory: Optional[HostMemoryEstimate] = None
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
            "host_memory": self.host_memory.as_dict() if self.host_memory else None,
            "disk": self.disk.as_dict() if self.disk else None,
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
        cls = (UsageError if all(f.check in USAGE_CHECKS for f in errors)
               else EnvironmentProblem if all(f.check in ENVIRONMENT_CHECKS for f in errors) else CheckFailed)
        raise cls(message, hint="; ".join(dict.fromkeys(hints)) or None)


ENVIRONMENT_CHECKS = {"disk"}  # the machine, not the command: exit 3
USAGE_CHECKS = {"assets", "seq_len", "batch", "ranks", "parallelism", "dataset", "outputs", "override-imports", "schedule",
                "lora"}
FINETUNE_LR_WARN = 1e-4  # a full fine-tune at or above this rate tends to erase what the model knew


# --- the checks ---------------------------------------------------------------------------


def check_assets(report: PreflightReport, cfg: RunConfig, assets_dir: Path) -> Optional[dict[str, Any]]:
    """config.json, tokenizer files, and (fine-tuning) every safetensors shard (:mod:`trnqwen.assets`)."""
    fetch_hint = f"run `{shlex.join(['trnqwen', 'fetch', str(cfg.model)])}` or pass --assets DIR with the model's HF files"
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


def _has_rope_scaling(hf_config: dict[str, Any]) -> bool:
    """config.json extends the context with RoPE scaling (yarn, linear, dynamic, ...)."""
    scaling = hf_config.get("rope_scaling")
    if isinstance(scaling, dict) and scaling:
        return True
    params = hf_config.get("rope_parameters")
    return isinstance(params, dict) and params.get("rope_type", "default") not in ("default", None)


def check_context(report: PreflightReport, cfg: RunConfig, hf_config: Optional[dict[str, Any]]) -> None:
    """--seq-len past the model's context (max_position_embeddings) without RoPE scaling."""
    if not hf_config:
        return
    try:
        limit = int(hf_config.get("max_position_embeddings") or 0)
    except (TypeError, ValueError):
        return
    if limit <= 0:
        return
    if cfg.seq_len <= limit or _has_rope_scaling(hf_config):
        scaled = " (RoPE scaling in config.json extends it)" if cfg.seq_len > limit else ""
        report.add(PLAN, "seq_len", f"--seq-len {cfg.seq_len} of the model's {limit:,}-token context "
                   f"(max_position_embeddings){scaled}")
        return
    report.add(
        ERROR,
        "seq_len",
        f"--seq-len {cfg.seq_len} is longer than the model's context: {limit} tokens "
        "(max_position_embeddings in config.json, no RoPE scaling)",
        f"use --seq-len {limit} or less",
    )


def check_topology(report: PreflightReport, topo: Topology, seq_len: Optional[int] = None) -> None:
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
    per_step = topo.local_batch_size * topo.dp
    accum = (f" x {topo.grad_accum_steps} gradient-accumulation steps ({per_step} per micro-step)"
             if topo.grad_accum_steps > 1 else "")
    tokens = (f"; {topo.sequences_per_step} x {seq_len} tokens (--seq-len) = {topo.sequences_per_step * seq_len:,} "
              "tokens per step" if seq_len else "")
    report.add(
        INFO if topo.grad_accum_steps > 1 else PLAN,  # accumulation is worth a line in every run
        "batch",
        f"global batch {topo.sequences_per_step} = local batch {topo.local_batch_size} x {topo.dp} data-parallel "
        f"rank(s){accum}{tokens}",
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
        if nproc_per_node > CPU_RANKS_PER_CORE_LIMIT * cpus:
            report.add(
                ERROR,
                "ranks",
                f"{nproc_per_node} CPU ranks on a {cpus}-core host: more than {CPU_RANKS_PER_CORE_LIMIT} per core "
                "cannot make progress",
                f"use --nproc-per-node {cpus} (one rank per core) or fewer",
            )
        elif nproc_per_node > cpus:
            report.add(
                WARNING,
                "ranks",
                f"{nproc_per_node} CPU ranks on {cpus} cores will be slow (ranks share cores)",
            )


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and not path.is_symlink() and path.parent != path:
        path = path.parent
    return path


def check_schedule(report: PreflightReport, cfg: RunConfig, schedule: Schedule, *, random_base: bool = False) -> None:
    """Steps, warm-up and LR that would waste or wreck the run (trnqwen.train.schedule).
    ``random_base``: the assets say their weights are random by design (builtin:tiny-qwen3): no
    knowledge for a high LR to erase."""
    if schedule is None:
        return
    if schedule.sequences is not None and schedule.global_batch and schedule.sequences < schedule.global_batch:
        report.add(ERROR, "schedule",
                   f"the dataset has {schedule.sequences:,} training sequence(s), fewer than one global batch of "
                   f"{schedule.global_batch}", "add data, or lower --global-batch-size / --local-batch-size / the ranks")
    elif schedule.steps < 1:
        report.add(ERROR, "schedule", f"--epochs {schedule.epochs:g} gives 0 steps (one epoch is "
                   f"{schedule.steps_per_epoch} step(s))", f"use --epochs {1 / (schedule.steps_per_epoch or 1):.3g} or more, or --steps N")
    if schedule.warmup_given and schedule.warmup_steps > schedule.steps:
        report.add(ERROR, "schedule", f"--warmup {schedule.warmup_steps} is more warm-up steps than the run's "
                   f"{schedule.steps} step(s)", "lower --warmup (a fraction such as 0.03 follows the step count)")
    for name in schedule.epoch_settings:
        if schedule.sequences is None:
            report.add(ERROR, "schedule", f"--{name.replace('_', '-')} epoch needs a --dataset to count an epoch",
                       f"give --dataset FILE, or --{name.replace('_', '-')} N steps")
    if cfg.finetune and not cfg.lora and not random_base and schedule.lr >= FINETUNE_LR_WARN:  # LoRA: 1e-4 by design
        from trnqwen.config import default_lr

        default, why = default_lr(cfg)  # this run's own: a full fine-tune's, or its method's
        report.add(WARNING, "schedule",
                   f"a full fine-tune of published weights at lr {schedule.lr:g} can erase what the model knew; "
                   f"this run's default is {default:g} ({why})", f"lower --lr, e.g. --lr {default:g}")


def check_outputs(report: PreflightReport, cfg: RunConfig, job: TrainJob, hf_config: Optional[dict[str, Any]] = None) -> None:
    """The run dir and the checkpoint folder can be created and written: a file in the way, a
    read-only mount or too little disk for the checkpoints is found now, not after minutes of training."""
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
        if label == "checkpoint folder":
            check_disk(report, cfg, job, hf_config, base)


def check_disk(report: PreflightReport, cfg: RunConfig, job: TrainJob, hf_config: Optional[dict[str, Any]], base: Path) -> None:
    """The checkpoints at their fullest (:mod:`trnqwen.train.disk`) against the free space where they go:
    refused now, with the numbers, not at the first save (``--no-disk-check``: a warning)."""
    if not job.num_params or job.schedule is None:
        return
    try:
        dims = _dims_for(cfg, hf_config) if hf_config else None
    except (KeyError, TypeError, ValueError):
        dims = None
    dtype = assets.checkpoint_dtype(hf_config) or "bfloat16"
    estimate = estimate_disk(
        num_params=int(job.num_params), trainable=_lora_trainable(cfg, dims) if dims else None,
        steps=job.schedule.steps, save_every=job.schedule.save_every, keep_last=cfg.keep_last,
        export_dtype_bytes=DTYPE_BYTES[dtype] if cfg.resolved_export_hf else None, lora=cfg.lora, merge=cfg.merge,
        sharded_export=cfg.backend != "hf-trainer", tied_embedding=dims.vocab_size * dims.dim if dims and dims.tied else 0,
    )
    _, free = free_bytes(base)
    report.disk = estimate
    # a resumed run's (or --overwrite's) own checkpoints are among those kept, or deleted: their room counts
    own = _tree_bytes(Path(job.checkpoint_dir).expanduser()) if job.checkpoint_dir else 0
    where = f"{_size(free)} free at {base}" if free is not None else f"free space at {base} unknown"
    if own:
        where += f" (+ {_size(own)} of this folder's own checkpoints)"
    if free is None or free + own >= estimate.total:
        report.add(PLAN, "disk", f"checkpoints need {estimate.describe()}; {where}")
        return
    report.add(
        ERROR if cfg.disk_check else WARNING, "disk",
        f"the checkpoints need {estimate.describe()}, but only {where}",
        "free disk space, pass --checkpoint-dir on a bigger disk, or keep fewer resume points (--keep-last, "
        "--save-every); --no-disk-check starts anyway (docs/resume.md)",
    )


def _tree_bytes(folder: Path) -> int:
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


# --- memory ---------------------------------------------------------------------------------


def _dims_for(cfg: RunConfig, hf_config: dict[str, Any]) -> Any:
    from trnqwen.titan_compat import FlavorDims, dims_from_hf_config

    dims = dims_from_hf_config(hf_config)
    if cfg.backend == "nki-moe":
        # The recipe cuts the MoE model to moe_layers layers and num_experts experts.
        dims = FlavorDims(**{**asdict(dims), "n_layers": cfg.moe_layers, "num_experts": cfg.num_experts, "top_k": cfg.top_k,
                              "dense_layers": ()})
    return dims


def check_memory(
    report: PreflightReport,
    cfg: RunConfig,
    device: DeviceInfo,
    dp: int,
    hf_config: Optional[dict[str, Any]],
    num_params: Optional[int] = None,
    *,
    ranks_per_node: int = 1,
    exports: bool = False,
) -> None:
    """Device memory per rank against HBM / GPU memory, host RAM of all ranks against the node's.

    Beyond the capacity is an error; above 90 % of it a warning.  On CPU the device is host RAM,
    so only the host budget (which includes the training state) is checked.
    """
    if not hf_config:
        return
    try:
        dims = _dims_for(cfg, hf_config)
    except (KeyError, TypeError, ValueError):
        report.add(WARNING, "memory", "cannot estimate memory: config.json lacks the usual Qwen3 fields")
        return
    on_host = device.type == "cpu"
    capacity = None if on_host else device.memory_bytes_per_rank
    if cfg.backend == "nki-moe":
        num_params = None  # the job's count is the cut model's only if the recipe says so
    est = estimate_memory(dims, cfg, dp, capacity=capacity, num_params=num_params, trainable=_lora_trainable(cfg, dims))
    report.memory = est
    host = estimate_host_memory(
        est, cfg, hf_config, device_type=device.type, ranks_per_node=ranks_per_node,
        exports=exports, capacity=device.host_memory_bytes,
    )
    report.host_memory = host
    fix = "lower --seq-len or --local-batch-size, raise --tp, or use more ranks"
    if not on_host:
        _against(report, "memory", est.total, capacity, f"estimated {est.describe()}", fix)
    else:  # on CPU the device is host RAM: the training state is part of the host row below
        report.add(PLAN, "memory", f"estimated {est.describe()}, in host RAM on CPU (counted in the host-memory row)")
    host_fix = (
        "use fewer ranks per node (--nproc-per-node), lower --seq-len or --local-batch-size, or a host with more RAM"
        if on_host else "use fewer ranks per node (--nproc-per-node) or a host with more RAM"
    )
    _against(report, "host-memory", host.per_node, host.capacity, f"estimated {host.describe()}", host_fix)


def _lora_trainable(cfg: RunConfig, dims: FlavorDims) -> Optional[int]:
    """The adapters' parameter count for a LoRA run (the frozen base has no grads or AdamW state)."""
    from trnqwen.adapters.lora import plan as lora

    return lora.trainable(cfg, dims)


def check_lora(report: PreflightReport, cfg: RunConfig, hf_config: Optional[dict[str, Any]] = None) -> None:
    """LoRA's own problems (:func:`trnqwen.adapters.lora.plan.preflight`) in the report."""
    from trnqwen.adapters.lora import plan as lora

    if not cfg.lora:
        return
    try:
        dims = _dims_for(cfg, hf_config) if hf_config else None
    except (KeyError, TypeError, ValueError):
        dims = None  # the memory check reports a config.json it cannot read
    for severity, problem, fix in lora.preflight(cfg, dims):
        report.add(ERROR if severity == "error" else WARNING, "lora", problem, fix)


def _against(report: PreflightReport, check: str, need: int, capacity: Optional[int], text: str, fix: str) -> None:
    if capacity and need > capacity:
        report.add(ERROR, check, f"{text}: does not fit", fix)
    elif capacity and need > MEMORY_WARN_FRACTION * capacity:
        report.add(WARNING, check, f"{text}: will likely not fit", fix)
    else:
        report.add(INFO, check, text)


# --- override imports -------------------------------------------------------------------------


def locate_module(name: str, search_path: list[str]) -> Optional[str]:
    """None when module ``name`` can be found, else the first dotted part that cannot.

    Nothing is imported: not the module, not its parent packages' ``__init__`` (which may import
    torch or a Neuron SDK); only the finders look at the file system.
    """
    import importlib.machinery
    import sys

    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return name
    top = parts[0]
    spec = importlib.machinery.PathFinder.find_spec(top, search_path)
    if spec is None and top in sys.builtin_module_names:
        return None if len(parts) == 1 else ".".join(parts[:2])
    if spec is None:  # installed through a meta-path hook (editable installs): ask the finders
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            try:
                spec = find(top, None) if find is not None else None
            except Exception:
                spec = None
            if spec is not None:
                break
    if spec is None:
        return top
    for i in range(1, len(parts)):
        locations = list(spec.submodule_search_locations or [])
        if not locations:
            return ".".join(parts[: i + 1])
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
        if spec is None:
            return ".".join(parts[: i + 1])
    return None


def check_override_imports(report: PreflightReport, cfg: RunConfig, search_path: list[str]) -> None:
    """Every ``--override-imports`` target names a module the ranks can import (``pkg.mod`` or
    ``pkg.mod.factory``): a typo is one line now, not a ModuleNotFoundError in every rank."""
    for target in cfg.override_imports or []:
        dotted = target.split("=", 1)[0].strip()
        missing = locate_module(dotted, search_path)
        if missing is None:
            continue
        module, _, _factory = dotted.rpartition(".")
        if module and locate_module(module, search_path) is None:
            continue  # pkg.mod exists; the last part is a factory in it
        report.add(
            ERROR,
            "override-imports",
            f"--override-imports {dotted}: no module named '{missing}' (looked in the working folder and the Python path)",
            "check the spelling, run from the folder that holds the module, or add its folder to PYTHONPATH",
        )


def preflight(
    cfg: RunConfig,
    device: DeviceInfo,
    job: TrainJob,
    topo: Topology,
    *,
    assets_dir: Optional[Path] = None,
    search_path: Optional[list[str]] = None,
) -> PreflightReport:
    """Run every check; nothing is started and nothing heavy is imported.

    ``search_path`` is where the ranks will look for ``--override-imports`` modules (their
    working folder and PYTHONPATH, then this interpreter's path).
    """
    import sys

    report = PreflightReport()
    hf_config = check_assets(report, cfg, Path(assets_dir or cfg.resolved_assets_dir))
    check_seq_len(report, cfg, device)
    check_context(report, cfg, hf_config)
    check_topology(report, topo, cfg.seq_len)
    check_ranks(report, device, topo.nproc_per_node)
    check_outputs(report, cfg, job, hf_config)
    check_schedule(report, cfg, job.schedule,
                   random_base=assets.declares_random_init(Path(assets_dir or cfg.resolved_assets_dir)))
    check_override_imports(report, cfg, search_path if search_path is not None else [os.getcwd(), *sys.path])
    check_lora(report, cfg, hf_config)
    if topo.problem(PARALLELISM) is None:
        # a LoRA export gathers only the adapters, not the whole model
        exports = bool(cfg.resolved_export_hf and job.checkpoint_dir and not cfg.lora)
        check_memory(
            report, cfg, device, topo.dp, hf_config, job.num_params,
            ranks_per_node=topo.nproc_per_node, exports=exports,
        )
    return report
