"""The quickstart's stages (each usable on its own) and :func:`run_quickstart`, which runs them in order."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from trnqwen.assets import INDEX_NAME
from trnqwen.constants import TINY_MODEL
from trnqwen.errors import CheckFailed, TrnqwenError, UsageError
from trnqwen.evaluate.lifecycle import QUICKSTART_TASK, harness_before_after, held_out_check, quickstart_chat_settings
from trnqwen.quickstart import lanes
from trnqwen.quickstart.progress import Progress
from trnqwen.quickstart.report import _finite, _fmt, compare_losses, write_loss_plot
from trnqwen.quickstart.types import (
    DEFAULT_FINETUNE_STEPS,
    DEFAULT_LOCAL_BATCH,
    DEFAULT_PRETRAIN_STEPS,
    DEFAULT_SEQ_LEN,
    DEFAULT_WORKDIR,
    FINETUNE_BACKENDS,
    FINETUNE_LR,
    MARKER,
    OVERRIDE_EXAMPLE,
    OVERRIDE_LOSS_TOLERANCE,
    PLOT_FILE,
    PRETRAIN_BACKEND,
    PRETRAIN_LR,
    SUMMARY_FILE,
    QuickstartResult,
    RunInfo,
    Stage,
    StageFailed,
    attach_result,
    stage_names,
)
from trnqwen.train.plan import TrainPlan

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

# --- the working folder ----------------------------------------------------------------------------


def prepare_workdir(workdir: Path) -> Path:
    """Create (or reuse) the quickstart's folder; refuse a folder that is someone else's."""
    workdir = Path(workdir).expanduser().absolute()
    if workdir.exists() and not workdir.is_dir():
        raise UsageError(f"{workdir} exists and is not a folder", hint="pass --workdir pointing at a new folder")
    if workdir.is_dir() and any(workdir.iterdir()) and not (workdir / MARKER).is_file():
        raise UsageError(
            f"{workdir} is not empty and was not made by trnqwen quickstart",
            hint="pass --workdir with a new folder name (the quickstart writes only there)",
        )
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("made by `trnqwen quickstart`; safe to delete\n")
    return workdir


def _fresh_dir(path: Path, workdir: Path) -> Path:
    """Remove a previous quickstart output (only ever inside the quickstart's own folder)."""
    path = path.absolute()
    if workdir not in path.parents:
        raise UsageError(f"refusing to clear {path}: not inside {workdir}")
    if path.exists():
        shutil.rmtree(path)
    return path


# --- stages ----------------------------------------------------------------------------------------


def stage_check_env(device: str, assets: Path) -> tuple[str, dict[str, Any]]:
    from trnqwen.env.probe import probe_environment

    report = probe_environment(device=device, assets_dir=assets, check_assets=False)  # the next stage fetches
    errors = [p for p in report.problems if p.severity == "error"]
    if errors:
        raise StageFailed(
            "check-env",
            "; ".join(p.message for p in errors),
            hint=errors[0].fix or "run `trnqwen check-env` for the details",
            exit_code=3,
        )
    dev = report.device
    versions = {k: report.packages.get(k) for k in ("torch", "torchtitan", "transformers")}
    text = f"{dev['type']} x {dev['count']}; " + ", ".join(f"{k} {v or 'missing'}" for k, v in versions.items())
    warnings = [p.message for p in report.problems if p.severity != "error"]
    return text, {"device": dev, "packages": versions, "warnings": warnings}


def stage_fetch(assets: Path) -> str:
    from trnqwen.fetch.download import fetch
    from trnqwen.units import format_bytes

    result = fetch(TINY_MODEL, assets, progress=False)
    if not result.verified:
        raise StageFailed("fetch", "; ".join(result.problems) or "the snapshot did not verify",
                          hint=f"delete {assets} and run the quickstart again")
    how = "written" if result.to_download else "reused"
    size = format_bytes(result.bytes, smallest="MiB", largest="MiB")
    return f"{TINY_MODEL} -> {assets} ({len(result.files)} files, {size}, {how}, verified)"


def run_config(**values: Any) -> RunConfig:
    """A :class:`RunConfig` from explicit values only: the quickstart ignores ./trnqwen.toml and
    TRNQWEN_* so it behaves the same everywhere."""
    from trnqwen.config import RunConfig

    return RunConfig(**values)


def train_run(stage: str, info: RunInfo, cfg: Any, workdir: Path, progress: Progress, *, status: bool,
              pythonpath: Optional[Path] = None, run_id: Optional[str] = None) -> RunInfo:
    """One ``trnqwen train`` through the real planner and launcher (run dir, torchrun, record);
    ``pythonpath`` goes first on the ranks' ``PYTHONPATH`` (where an override module lives)."""
    from trnqwen.session.training import TrainHooks, TrainRequest, run_training

    def planned(plan: TrainPlan) -> None:
        info.run_dir = str(plan.run_dir)
        info.log = str(plan.log_path)
        info.nproc_per_node = plan.nproc_per_node
        info.checkpoint_dir = str(plan.job.checkpoint_dir) if plan.job.checkpoint_dir else None
        errors = [f for f in plan.preflight.findings if f.severity == "error"]
        if errors:
            raise StageFailed(stage, "preflight: " + "; ".join(f.message for f in errors), hint=errors[0].hint)
        progress.watch(stage, plan.log_path, steps=cfg.steps, live=status)  # how far it is, for the heartbeat
        if status:
            progress.note(f"{plan.nproc_per_node} rank(s), {cfg.steps} step(s), log {plan.log_path}")

    # the same library call as `trnqwen train` (the run policy in one place); the stages judge the
    # runs themselves, so no evaluation after training
    request = TrainRequest(cfg, cwd=workdir, pythonpath=[pythonpath] if pythonpath is not None else (), run_id=run_id,
                           evaluate=False)
    session = run_training(request, TrainHooks(planned=planned, status=status))
    outcome, plan = session.outcome, session.plan
    info.status = outcome.record.status if outcome.record else None
    info.wall_s = round(outcome.result.wall_s, 1) if outcome.result else None
    info.exported = str(outcome.exported) if outcome.exported else None
    if outcome.exit_code != 0:
        r = outcome.result
        raise StageFailed(
            stage,
            f"training ended with {r.ended_by if r else 'an error'}: "
            f"{(r.error if r else None) or ('stopped' if r and r.ended_by.startswith('SIG') else 'a rank failed')}",
            hint=f"full log: {plan.log_path}",
            exit_code=outcome.exit_code if outcome.exit_code in (130, 143) else None,
        )
    if cfg.resolved_export_hf and outcome.exported is None:
        raise StageFailed(stage, f"no HF export appeared under {plan.job.checkpoint_dir}", hint=f"see {plan.log_path}")
    return info


def make_snapshot(base_assets: Path, exported: Path, dest: Path) -> Path:
    """A "published model" folder: the base snapshot's config and tokenizer + the exported weights.

    The export may be stored in another float type than config.json's ``torch_dtype`` (torchtitan
    exports float16 by default); the weights are converted to the config's dtype so the snapshot
    reads exactly like a Hub repo.  Written to a temp folder and renamed into place.
    """
    import numpy as np
    from safetensors.numpy import load_file, save

    config = json.loads((base_assets / "config.json").read_text())
    want = {"float32": np.float32, "float16": np.float16}.get(str(config.get("torch_dtype", "float32")), np.float32)
    dest = dest.absolute()
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if (base_assets / name).is_file():
                shutil.copy2(base_assets / name, tmp / name)
        shards = sorted(exported.glob("*.safetensors"))
        if not shards:
            raise StageFailed("snapshot", f"{exported} holds no *.safetensors")
        for shard in shards:
            tensors = load_file(str(shard))
            # bytes written by Python, so a full disk is an OSError (ENOSPC: exit 3), not safetensors' own error type
            (tmp / shard.name).write_bytes(
                save({k: np.ascontiguousarray(v.astype(want)) for k, v in tensors.items()}, metadata={"format": "pt"})
            )
        index = exported / INDEX_NAME
        if index.is_file():
            data = json.loads(index.read_text())
            total = 0
            for shard in shards:
                total += sum(v.nbytes for v in load_file(str(tmp / shard.name)).values())
            data.setdefault("metadata", {})["total_size"] = total
            (tmp / index.name).write_text(json.dumps(data, indent=2) + "\n")
        (tmp / "README.md").write_text(
            "# tiny-qwen3, pre-trained by `trnqwen quickstart`\n\n"
            f"Weights: the HF export of the quickstart's pre-training run ({exported}).\n"
            f"Config and tokenizer: {base_assets}.\n"
        )
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def verify_checkpoint(stage: str, checkpoint_dir: Path, assets: Path, *, round_trip: bool) -> dict[str, Any]:
    from trnqwen.ckpt import locate, verify

    ckpt, model_config = locate(checkpoint_dir, assets=assets)
    report = verify(ckpt, model_config, round_trip=round_trip)
    summary = {
        "ok": report.ok,
        "checkpoint": report.checkpoint,
        "step": report.step,
        "tensors": report.num_tensors,
        "parameters": report.num_parameters,
        "scanned": report.scanned,
        "nonfinite_tensors": len(report.nonfinite),
        "expected_missing": report.expected_missing,
        "round_trip": report.round_trip,
        "problems": report.problems,
    }
    if not report.ok:
        raise StageFailed(stage, "; ".join(report.problems), hint=shlex.join(["trnqwen", "verify-ckpt", str(checkpoint_dir)]))
    return summary


def inspect_run(info: RunInfo) -> Any:
    from trnqwen.logs.core import inspect_input
    from trnqwen.logs.sources import resolve_input

    inspection = inspect_input(resolve_input(info.run_dir))
    steps = list(inspection.log.steps.rows())
    info.losses = [s.get("loss") for s in steps]
    info.step1_loss = inspection.log.steps.get(1, {}).get("loss")
    info.last_loss = steps[-1].get("loss") if steps else None
    info.findings = [f.as_dict() for f in inspection.findings if f.severity in ("error", "warning")]
    return inspection


def override_example_dir() -> Optional[Path]:
    """``examples/torch_rope`` of the source tree trnqwen runs from (None in a wheel install)."""
    folder = Path(__file__).resolve().parents[2] / "examples" / "torch_rope"
    return folder if (folder / (OVERRIDE_EXAMPLE.split(".")[0] + ".py")).is_file() else None


OVERRIDE_SKIPPED = ("examples/torch_rope is not installed (a wheel ships no examples/); "
                    "run the quickstart from a source checkout for the custom-kernel stage")


def check_override_ran(info: RunInfo, inspection: Any, num_layers: int, reference: Optional[RunInfo]) -> str:
    """The override run's proof, as ``inspect-logs`` reads it: every rank that reported ran the
    twin's own rotation on every layer with no fallback, and (given the plain native run) the
    step losses equal that run's."""
    stage = "override"
    per_rank = inspection.log.override_calls.get(OVERRIDE_EXAMPLE, {})
    if not per_rank:
        raise StageFailed(stage, f"{OVERRIDE_EXAMPLE} logged no [OverrideCalls] line: nothing shows it ran",
                          hint=f"see {info.log}")
    for rank, r in sorted(per_rank.items()):
        if r["calls"] == 0 or r["fallbacks"] or r["modules"] != num_layers:
            raise StageFailed(stage, f"rank {rank}: calls={r['calls']} fallbacks={r['fallbacks']} on "
                                     f"{r['modules']} of {num_layers} layers" + (f" ({r['reason']})" if r["reason"] else ""),
                              hint=f"see {info.log}")
    calls = ", ".join(f"rank {rank} calls={r['calls']} fallbacks={r['fallbacks']}" for rank, r in sorted(per_rank.items()))
    detail = f"{OVERRIDE_EXAMPLE} ran its own rotation on {num_layers}/{num_layers} layers ({calls})"
    if reference is not None and reference.losses:
        pairs = list(zip(info.losses, reference.losses))
        if len(info.losses) != len(reference.losses) or not all(_finite(a) and _finite(b) for a, b in pairs):
            raise StageFailed(stage, f"step losses {info.losses} cannot be compared with {reference.label}'s {reference.losses}")
        diff = max(abs(a - b) for a, b in pairs)
        if diff > OVERRIDE_LOSS_TOLERANCE:
            raise StageFailed(stage, f"step losses differ from {reference.label}'s by {diff:.2e} "
                                     f"(> {OVERRIDE_LOSS_TOLERANCE:g}): {info.losses} vs {reference.losses}")
        detail += f"; step losses equal {reference.label}'s (max diff {diff:.1e})"
    return detail


# --- the whole thing --------------------------------------------------------------------------------


def run_quickstart(
    workdir: Path = DEFAULT_WORKDIR,
    *,
    device: str = "cpu",
    steps: Optional[int] = None,
    pretrain_steps: Optional[int] = None,
    nproc_per_node: Optional[int] = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    backends: Sequence[str] = FINETUNE_BACKENDS,
    progress: bool = True,
    status: Optional[bool] = None,
    on_stage: Optional[Callable[[Stage], None]] = None,
) -> QuickstartResult:
    """Run every stage in order; stops at the first failure (the result names it) and raises
    :class:`StageFailed` after recording it.  Returns the result when every stage passed."""
    started = time.monotonic()
    steps = steps or DEFAULT_FINETUNE_STEPS
    pretrain_steps = pretrain_steps or DEFAULT_PRETRAIN_STEPS
    if steps < 1 or pretrain_steps < 2:
        raise UsageError("--steps must be at least 1 and --pretrain-steps at least 2")
    unknown = [b for b in backends if b not in FINETUNE_BACKENDS]
    if unknown or not backends:
        raise UsageError(f"quickstart backends are {', '.join(FINETUNE_BACKENDS)}; got {', '.join(unknown) or 'none'}")
    workdir = prepare_workdir(workdir)
    result = QuickstartResult(workdir=str(workdir), device=device)
    status = progress if status is None else status
    example = override_example_dir()
    from trnqwen.methods import registry as methods

    method_stages = [(m, methods.load(m.quickstart)) for m in methods.methods() if m.quickstart]
    # the stages in their documented order: their numbers, and the order of result.stages
    canonical = stage_names(tuple(backends), [mod.STAGE for _, mod in method_stages])
    prog = Progress(progress, len(canonical))
    assets = workdir / "assets" / "tiny-qwen3"
    pretrained = workdir / "assets" / "tiny-qwen3-pretrained"
    runs_dir = workdir / "runs"
    ckpts = workdir / "checkpoints"
    common = dict(
        model=TINY_MODEL, device=device, seq_len=seq_len, local_batch_size=DEFAULT_LOCAL_BATCH,
        runs_dir=runs_dir, warmup=1, seed=42,
    )

    from trnqwen.adapters.lora import quickstart as lora_stage  # LoRA's stage (its folder)

    def stage(name: str, what: str, fn: Callable[[], Any], skipped: Optional[str] = None, lane: bool = False) -> Any:
        prog.start(name, what)
        st = Stage(name=name, skipped=skipped, ok=skipped is not None)
        t0 = time.monotonic()
        try:
            if skipped is not None:  # shown as skipped, with the reason, in its place
                return None
            value = fn()
            st.ok = True
            if isinstance(value, tuple):
                st.detail = str(value[0])
            elif isinstance(value, str):
                st.detail = value
            return value
        except TrnqwenError as exc:
            st.error = exc.message
            result.failed_stage = name
            result.error = exc.message
            if not isinstance(exc, StageFailed):
                exc = StageFailed(name, exc.message, hint=exc.hint, exit_code=exc.exit_code)
            raise exc from None
        except Exception as exc:  # a bug (exit 70) or the system's refusal (a full disk: 3): the stage is named
            st.error = f"{type(exc).__name__}: {exc}"  # in the result; the CLI's one error table picks the exit code
            result.failed_stage = name
            result.error = st.error
            raise
        finally:
            st.seconds = round(time.monotonic() - t0, 2)
            result.stages.append(st)
            prog.done(st, name=name if lane else None)  # lanes end in any order: name the stage
            if on_stage is not None:
                on_stage(st)

    try:
        stage("check-env", f"device {device}", lambda: stage_check_env(device, assets))
        stage("fetch", TINY_MODEL, lambda: stage_fetch(assets))
        result.files["assets"] = str(assets)

        # pre-training from random init, exporting HF weights
        pre = RunInfo(label="pretrain", backend=PRETRAIN_BACKEND, finetune=False, steps=pretrain_steps,
                      nproc_per_node=nproc_per_node or 1)
        result.runs["pretrain"] = pre
        pre_ckpt = _fresh_dir(ckpts / "pretrain", workdir)
        pre_cfg = run_config(
            **common, assets_dir=assets, backend=PRETRAIN_BACKEND, finetune=False, export_hf=True,
            steps=pretrain_steps, lr=PRETRAIN_LR, checkpoint_dir=pre_ckpt, nproc_per_node=nproc_per_node or 1,
        )

        def pretrain() -> str:
            train_run("pre-train", pre, pre_cfg, workdir, prog, status=status)
            inspect_run(pre)
            return (f"{pretrain_steps} steps from random init: loss {_fmt(pre.step1_loss)} -> {_fmt(pre.last_loss)}; "
                    f"exported {pre.exported}")

        stage("pre-train", f"{PRETRAIN_BACKEND} backend, random init, {pretrain_steps} steps, export HF weights", pretrain)

        def snapshot() -> str:
            make_snapshot(assets, Path(pre.exported), pretrained)
            return f"{pretrained} (exported weights + config/tokenizer of {TINY_MODEL})"

        stage("snapshot", "the pre-trained weights as a published model", snapshot)
        result.files["pretrained_snapshot"] = str(pretrained)

        ft_ranks = nproc_per_node or 2
        runs_dir.mkdir(parents=True, exist_ok=True)
        jobs: list[lanes.Job] = []  # every training stage after the snapshot, two at a time

        def lane_stage(name: str, what: str, fn: Callable[[], Any], *, after: tuple[str, ...] = (),
                       skipped: Optional[str] = None) -> None:
            jobs.append(lanes.Job(name, lambda: stage(name, what, fn, skipped, lane=True), after))

        def run_id(cfg: RunConfig) -> str:  # named after what the stage trains (backend, method, LoRA)
            return lanes.reserve_run_id(runs_dir, cfg.backend, method=cfg.method, lora=cfg.lora)

        for backend in backends:
            info = RunInfo(label=backend, backend=backend, finetune=True, steps=steps, nproc_per_node=ft_ranks)
            ckpt = _fresh_dir(ckpts / backend, workdir)
            cfg = run_config(
                **common, assets_dir=pretrained, backend=backend, finetune=True, steps=steps, lr=FINETUNE_LR,
                checkpoint_dir=ckpt, nproc_per_node=ft_ranks,
            )

            def finetune(info=info, cfg=cfg) -> str:
                train_run(f"train --finetune ({info.backend})", info, cfg, workdir, prog, status=False,
                          run_id=run_id(cfg))
                inspect_run(info)
                return (f"{info.backend}: {steps} step(s) on {info.nproc_per_node} rank(s), step-1 loss "
                        f"{_fmt(info.step1_loss)} -> {_fmt(info.last_loss)}; exported {info.exported}")

            result.runs[backend] = info
            lane_stage(f"train --finetune ({backend})", f"from {pretrained.name}, {steps} step(s)", finetune)

        if example is not None:  # the custom-kernel workflow, with the NKI example's CPU twin
            from trnqwen.fetch.builtin import tiny_qwen3_config

            ov = RunInfo(label="override", backend="native", finetune=True, steps=steps, nproc_per_node=ft_ranks)
            ov_cfg = run_config(
                **common, assets_dir=pretrained, backend="native", finetune=True, steps=steps, lr=FINETUNE_LR,
                checkpoint_dir=_fresh_dir(ckpts / "override", workdir), nproc_per_node=ft_ranks,
                override_imports=[OVERRIDE_EXAMPLE], export_hf=False,
            )

            def override() -> str:
                train_run("override", ov, ov_cfg, workdir, prog, status=False, pythonpath=example, run_id=run_id(ov_cfg))
                inspection = inspect_run(ov)
                return check_override_ran(ov, inspection, tiny_qwen3_config()["num_hidden_layers"],
                                          result.runs.get("native"))

            result.runs["override"] = ov
            # after the native fine-tune: its losses are the reference
            lane_stage("override", f"native fine-tune with --override-imports {OVERRIDE_EXAMPLE}", override,
                       after=("train --finetune (native)",))
        else:
            lane_stage("override", f"native fine-tune with --override-imports {OVERRIDE_EXAMPLE}", lambda: None,
                       skipped=OVERRIDE_SKIPPED)

        chat_settings = quickstart_chat_settings(workdir)  # the chat stage: the bundled chat set with a held-out split
        chat = result.runs["chat"] = RunInfo(label="chat", backend=PRETRAIN_BACKEND, finetune=True, steps=chat_settings["steps"], nproc_per_node=ft_ranks)
        chat_cfg = run_config(**common, **chat_settings, assets_dir=pretrained, backend=PRETRAIN_BACKEND, finetune=True, checkpoint_dir=_fresh_dir(ckpts / "chat", workdir), nproc_per_node=ft_ranks)

        def chat_finetune() -> str:
            train_run("chat fine-tune", chat, chat_cfg, workdir, prog, status=False, run_id=run_id(chat_cfg))
            inspect_run(chat)
            chat.verify = verify_checkpoint("chat fine-tune", Path(chat.checkpoint_dir), pretrained, round_trip=device == "cpu")
            result.evaluation = held_out_check(Path(chat.run_dir), device=device)
            bench = result.evaluation["benchmarks"] = harness_before_after(Path(chat.run_dir), device=device)
            if "error" in bench:
                raise CheckFailed(bench["line"], hint=f"trnqwen eval {chat.run_dir} --tasks {QUICKSTART_TASK}")
            return f"{result.evaluation['line']}; {bench['line']}"

        lo = result.runs["lora"] = RunInfo(label="lora", backend=PRETRAIN_BACKEND, finetune=True, steps=chat_settings["steps"], nproc_per_node=ft_ranks)
        lo_cfg = run_config(**{**common, **lora_stage.lora_settings(chat_settings)}, assets_dir=pretrained, backend=PRETRAIN_BACKEND,
                            finetune=True, checkpoint_dir=_fresh_dir(ckpts / "lora", workdir), nproc_per_node=ft_ranks)

        def lora_finetune() -> str:
            train_run(lora_stage.STAGE, lo, lo_cfg, workdir, prog, status=False, run_id=run_id(lo_cfg))
            inspect_run(lo)
            from trnqwen.ckpt.merge import merged_path

            line, result.lora = lora_stage.judge_lora_run(lo.log, lo.exported, pretrained, verify=verify_checkpoint,
                                                          fail=StageFailed, merged_path=merged_path)
            lo.verify = result.lora["merged_verify"]  # the adapter's merged folder, verified like any export
            return line

        lane_stage("chat fine-tune", f"bundled chat set, {chat.steps} steps, held-out loss, one answer and "
                   f"{QUICKSTART_TASK} (eval --tasks) before/after", chat_finetune)
        lane_stage(lora_stage.STAGE, f"the chat set again as a rank-{lora_stage.LORA_RANK} LoRA adapter, merged", lora_finetune)
        from trnqwen.evaluate.lifecycle import validation_before_after

        for method, mod in method_stages:  # each method's stage (trnqwen/methods/<name>/quickstart.py)
            m_settings = mod.stage_settings(chat_settings, ft_ranks)
            m_info = result.runs[method.name] = RunInfo(label=method.name, backend=PRETRAIN_BACKEND, finetune=True,
                                                        steps=m_settings["steps"], nproc_per_node=ft_ranks)
            m_cfg = run_config(**{**common, **m_settings}, assets_dir=pretrained, backend=PRETRAIN_BACKEND, finetune=True,
                               checkpoint_dir=_fresh_dir(ckpts / method.name, workdir), nproc_per_node=ft_ranks)

            def method_stage(method=method, mod=mod, info=m_info, cfg=m_cfg) -> str:  # from the chat stage's start
                train_run(mod.STAGE, info, cfg, workdir, prog, status=False, run_id=run_id(cfg))
                inspect_run(info)
                line, result.methods[method.name] = mod.judge_run(info, device=device, fail=StageFailed,
                                                                  before_after=validation_before_after)
                return line

            lane_stage(mod.STAGE, mod.WHAT.format(steps=m_info.steps), method_stage)
        # the longest first, so the two lanes end close together
        longest_first = [*(mod.STAGE for _, mod in method_stages), "chat fine-tune", "train --finetune (native)",
                         lora_stage.STAGE]
        jobs.sort(key=lambda j: longest_first.index(j.name) if j.name in longest_first else len(longest_first))
        lanes.run_jobs(jobs)

        for backend in backends:
            info = result.runs[backend]

            def check(info=info) -> str:
                info.verify = verify_checkpoint(f"verify-ckpt ({info.backend})", Path(info.checkpoint_dir), pretrained,
                                                round_trip=device == "cpu")
                v = info.verify
                extra = ""
                if v.get("round_trip") and not v["round_trip"].get("skipped"):
                    extra = "; round trip missing " + str(v["round_trip"].get("missing_keys", v["expected_missing"]))
                return (f"{info.exported}: {v['tensors']} tensors, {v['parameters']:,} parameters, all finite" + extra)

            stage(f"verify-ckpt ({backend})", str(info.checkpoint_dir), check)

        def judge() -> str:
            # the pre-training and the short fine-tunes from it (the chat, LoRA and method stages judge their own)
            own = ("chat", "lora", *(m.name for m, _ in method_stages))
            judged = {label: info for label, info in result.runs.items() if label not in own}
            errors = [(label, f) for label, info in judged.items() for f in info.findings if f.get("severity") == "error"]
            if errors:
                label, f = errors[0]
                raise StageFailed("inspect-logs", f"{label}: {f.get('message')}", hint=shlex.join(["trnqwen", "inspect-logs", str(result.runs[label].run_dir)]))
            result.comparison = compare_losses(judged)
            plot = write_loss_plot(judged, workdir / PLOT_FILE)
            result.files["loss_plot"] = str(plot)
            c = result.comparison
            gaps = ", ".join(f"{k} {_fmt(v['step1_loss'])}" for k, v in c["finetunes"].items())
            return f"step-1 loss: random init {_fmt(c['random_init_step1_loss'])} vs fine-tune {gaps}; plot {plot}"

        stage("inspect-logs", "judge every run, compare random init with the fine-tunes, plot", judge)
        result.ok = True
    except Exception as exc:  # the CLI still prints what was done, whatever stopped it
        attach_result(exc, result)
        raise
    finally:
        prog.close()
        result.stages.sort(key=lambda st: canonical.index(st.name))  # lanes end in any order
        result.seconds = round(time.monotonic() - started, 1)
        for label, info in result.runs.items():
            if info.run_dir:
                result.files[f"run {label}"] = info.run_dir
            if info.exported:
                result.files[f"checkpoint {label}"] = info.exported
        summary_path = workdir / SUMMARY_FILE
        result.files["summary"] = str(summary_path)
        from trnqwen.fsutil import write_json_atomic

        write_json_atomic(summary_path, result.as_dict())
    return result


