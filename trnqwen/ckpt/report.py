"""verify-ckpt from resolved flags to output: the rich summary, ``--json``, and the exit code.

Kept out of ``trnqwen/cli`` so the CLI module stays a thin signature; imports rich lazily.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from trnqwen.ckpt.layout import CheckpointFiles
from trnqwen.ckpt.verify import VerifyReport
from trnqwen.ckpt.verify_adapter import UNTRAINED, AdapterReport
from trnqwen.errors import CheckFailed, redact
from trnqwen.units import format_bytes

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

SHOW = 10  # findings listed per kind in the human summary


def run_verify(
    *,
    checkpoint: Optional[Path],
    step: Optional[int],
    assets: Optional[Path],
    quick: bool,
    round_trip: bool,
    compare_to: Optional[Path],
    max_rel_change: float,
    generate: Optional[str],
    max_new_tokens: int,
    json_out: bool,
    cfg: RunConfig,
    base: Optional[Path] = None,
) -> VerifyReport | AdapterReport:
    """Locate, verify and report one checkpoint; ``cfg`` (resolved by the CLI) names the model,
    device and trust setting when the checkpoint's own run record does not."""
    from trnqwen import output
    from trnqwen.ckpt import locate, resolve_checkpoint, verify
    from trnqwen.errors import UsageError

    if step is not None and step < 0:
        raise UsageError(f"--step must be >= 0 (got {step})")
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1 (got {max_new_tokens})")
    ckpt, model_config = locate(checkpoint, step=step, assets=assets, run_config=cfg, base=base)
    if ckpt.note:
        output.warn(ckpt.note)
    from trnqwen.ckpt.verify_adapter import is_adapter

    if is_adapter(ckpt):
        return _run_verify_adapter(ckpt, model_config, quick=quick, compare_to=compare_to, generate=generate,
                                   json_out=json_out, cfg=cfg)
    reference = resolve_checkpoint(compare_to) if compare_to is not None else None

    with _Progress(enabled=not json_out and sys.stderr.isatty()) as progress:
        report = verify(
            ckpt,
            model_config,
            quick=quick,
            round_trip=round_trip,
            compare_to=reference,
            max_rel_change=max_rel_change,
            generate_prompt=generate,
            generate_options={"max_new_tokens": max_new_tokens, "device": cfg.device},
            trust_remote_code=cfg.trust_remote_code,
            progress=progress,
        )
    _show(report, ckpt, json_out, render)
    problems = report.problems
    if problems:
        more = f" (+{len(problems) - 1} more finding(s) above)" if len(problems) > 1 else ""
        raise CheckFailed(
            f"checkpoint {report.checkpoint} failed verification: {problems[0]}{more}",
            hint=_hint(report),
        )
    return report


def _row_adder(rows: list) -> Any:
    """``row(name, ok, detail)`` appending one check row (ok / FAILED / skipped for True / False / None)."""
    from rich.markup import escape

    def row(name: str, ok: Optional[bool], detail: str) -> None:
        mark = "[green]ok[/green]" if ok else ("[red]FAILED[/red]" if ok is False else "[dim]skipped[/dim]")
        rows.append((name, mark, escape(redact(detail))))

    return row


def _show(report: VerifyReport | AdapterReport, ckpt: CheckpointFiles, json_out: bool, render_table: Callable[..., None]) -> None:
    """The report as one JSON object (with the checkpoint folder's steps and any note) or as tables."""
    from trnqwen import output

    if json_out:
        doc = report.to_json()
        if ckpt.folder is not None:
            doc["checkpoint_folder"] = ckpt.folder  # every resume point and export, complete or not
        if ckpt.note:
            doc["note"] = ckpt.note
        output.print_json(doc)
    else:
        render_table(report, ckpt.other_steps)
        if ckpt.folder is not None:
            render_folder(ckpt.folder)


def _run_verify_adapter(ckpt, model_config, *, quick: bool, compare_to: Optional[Path], generate: Optional[str],
                        json_out: bool, cfg: RunConfig) -> AdapterReport:
    """A PEFT LoRA adapter folder: checked against its base (trnqwen.ckpt.verify_adapter)."""
    from trnqwen import output
    from trnqwen.ckpt.verify_adapter import verify_adapter
    from trnqwen.errors import UsageError

    for flag, value in (("--compare-to", compare_to), ("--generate", generate)):
        if value is not None:
            raise UsageError(
                f"{flag} compares or runs a whole model, and {ckpt.root} is a LoRA adapter",
                hint="verify the adapter without it; `trnqwen eval` scores and answers with base + adapter side by side",
            )
    report = verify_adapter(ckpt, model_config, quick=quick, trust_remote_code=cfg.trust_remote_code)
    _show(report, ckpt, json_out, render_adapter)
    for warning in report.warnings:
        output.warn(warning)
    problems = report.problems
    if problems:
        more = f" (+{len(problems) - 1} more finding(s) above)" if len(problems) > 1 else ""
        only_values = report.nonfinite and len(problems) == 1
        raise CheckFailed(
            f"adapter {report.checkpoint} failed verification: {problems[0]}{more}",
            hint="training diverged or the export is corrupt: check `trnqwen inspect-logs` for NaN loss, lower --lr"
            if only_values else "the adapter does not fit its base: check --base (the snapshot it was trained on) and "
            "the run's export (see --json for every key)",
        )
    return report


def render_adapter(report: AdapterReport, other_steps: list[int] | None = None) -> None:
    """The human summary of an adapter check: one row per check, then the findings."""
    from rich.markup import escape
    from rich.table import Table

    from trnqwen.output import console

    out = console(stderr=False)
    step = f" (step {report.step})" if report.step is not None else ""
    cfg = report.adapter_config
    out.print(f"[bold]LoRA adapter[/bold] {escape(report.checkpoint + step)}")
    out.print(f"  {report.num_tensors} tensors, {report.modules} adapted module(s), {report.num_parameters:,} parameters, "
              f"{_size(report.total_bytes)}; r {cfg.get('r')}, alpha {cfg.get('lora_alpha')}, targets "
              f"{','.join(report.targets) or 'none'}")
    out.print(f"[bold]Base[/bold] {report.model}")
    out.print(f"  {escape(report.base)} ({escape(report.base_source)})")
    rows: list[tuple[str, str, str]] = []
    row = _row_adder(rows)

    row("adapter_config.json", not report.config_problems, report.config_problems[0] if report.config_problems
        else f"peft_type LORA, r {cfg.get('r')}, target_modules {cfg.get('target_modules')}")
    row("files readable", not report.file_errors, "; ".join(f"{n}: {e}" for n, e in report.file_errors.items())
        or "adapter_model.safetensors")
    if not report.file_errors or list(report.file_errors) == ["scan"]:
        bad_keys = report.invalid_keys + report.unknown_modules + report.not_targeted + report.unpaired + report.missing_modules
        row("keys", not bad_keys, f"{len(bad_keys)} problem(s): {bad_keys[0]}" if bad_keys
            else f"every key a LoRA pair on a targeted module of the base ({report.modules} modules)")
        row("shapes", not report.shape_mismatches, f"{len(report.shape_mismatches)} mismatch(es)" if report.shape_mismatches
            else "A [r, in], B [out, r] fit the base")
        if report.scanned:
            row("finite values", not report.nonfinite, f"{len(report.nonfinite)} tensor(s) with NaN/Inf" if report.nonfinite
                else f"all {report.num_parameters:,} values finite")
            row("trained", None if report.untrained else True, UNTRAINED if report.untrained
                else f"{report.nonzero_b} lora_B tensor(s) non-zero")
        else:
            row("finite values", None, "--quick: not scanned")
        rt = report.round_trip
        if rt is None:
            row("peft round trip", None, "--quick: not loaded" if not report.scanned or not report.config_problems
                else "adapter_config.json unusable")
        elif rt.get("error"):
            row("peft round trip", False, rt["error"])
        else:
            bad = rt["missing_adapter_keys"] + rt["unexpected_keys"]
            row("peft round trip", not bad, f"{rt['library']}, {rt['model_class']} on meta: {rt['loaded']} tensors loaded, "
                f"{len(rt['missing_adapter_keys'])} missing, {len(rt['unexpected_keys'])} unexpected adapter keys")
    table = Table(show_header=True, title_justify="left")
    for col in ("check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*r)
    out.print(table)
    for title, items in (
        ("Invalid keys", report.invalid_keys), ("Unknown modules", report.unknown_modules),
        ("Not in target_modules", report.not_targeted), ("Unpaired", report.unpaired),
        ("Targeted modules without an adapter", report.missing_modules),
        ("Shape mismatches", [f"{m['key']}: {m['found']}, the base needs {m['expected']}" for m in report.shape_mismatches]),
        ("Non-finite values", [f"{k}: {v['nan']:,} NaN, {v['inf']:,} Inf" for k, v in report.nonfinite_detail.items()]),
    ):
        if items:
            out.print(f"[bold]{title}[/bold] ({len(items)}):")
            for item in items[:SHOW]:
                out.print(f"  {item}", markup=False)
            if len(items) > SHOW:
                out.print(f"  ... and {len(items) - SHOW} more (--json lists all)")
    if report.ok:
        out.print("[green bold]OK[/green bold]: a PEFT LoRA adapter that loads onto its base"
                  + ("" if report.scanned else " (values not scanned, not loaded: --quick)"))


def _hint(report: VerifyReport) -> str:
    if report.file_errors:
        return "re-copy or re-export the damaged file(s); verify-ckpt never modifies the checkpoint"
    if report.diagnosis:
        return "pass --assets with the snapshot this checkpoint was trained from"
    if report.missing_keys or report.unexpected_keys or report.fatal_mismatches:
        return "the export does not match config.json; check the run's backend and --assets (see --json for every key)"
    if report.nonfinite:
        return "training diverged or the export is corrupt: check `trnqwen inspect-logs` for NaN loss, lower --lr"
    return "see the findings above (--json lists every one)"


class _Progress:
    """A rich progress bar on stderr (only on a terminal); ``self(label, total)`` -> advance fn."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            from trnqwen.output import console

            self.bar = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                console=console(), transient=True,
            )
            self.bar.__enter__()
        return self if self.enabled else None

    def __call__(self, label: str, total: int):
        task = self.bar.add_task(label, total=total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


def _size(n: int) -> str:
    return format_bytes(n, digits=2, si=True)


def render_folder(folder: dict[str, Any]) -> None:
    """The checkpoint folder's steps: which can be resumed from / verified, which are incomplete."""
    from rich.markup import escape

    from trnqwen.output import console

    out = console(stderr=False)
    out.print(f"[bold]Checkpoint folder[/bold] {escape(folder['root'])}")
    for label, key in (("resume points", "resume"), ("HF exports", "exports"), ("old-layout steps", "legacy")):
        items = folder.get(key) or []
        if not items:
            continue
        done = [str(s["step"]) for s in items if s["complete"]]
        bad = [str(s["step"]) for s in items if not s["complete"]]
        text = f"  {label}: complete {', '.join(done) or 'none'}"
        if bad:
            text += f"; [yellow]incomplete {', '.join(bad)}[/yellow] (never used)"
        out.print(text)


def render(report: VerifyReport, other_steps: list[int] | None = None) -> None:
    """The human summary on stdout: what was checked, one row per check, then the findings."""
    from rich.markup import escape
    from rich.table import Table

    from trnqwen.output import console

    out = console(stderr=False)
    step = f" (step {report.step}" + (f"; other steps: {', '.join(map(str, other_steps))}" if other_steps else "") + ")" if report.step is not None else ""
    out.print(f"[bold]Checkpoint[/bold] {escape(report.checkpoint + step)}")
    out.print(
        f"  {len(report.files)} file(s), {report.num_tensors} tensors, {report.num_parameters:,} parameters, "
        f"{_size(report.total_bytes)}"
    )
    out.print(f"[bold]Model[/bold] {report.model}")
    out.print(f"  config.json: {escape(report.config_path)} ({report.config_source})")

    rows: list[tuple[str, str, str]] = []
    row = _row_adder(rows)

    row(
        "files readable",
        not report.file_errors,
        "; ".join(f"{n}: {e}" for n, e in report.file_errors.items()) or f"{len(report.files)} valid safetensors file(s)",
    )
    if report.index:
        row("index vs shards", not report.index_problems, report.index_problems[0] if report.index_problems else "every listed tensor where it says, no strays")
    elif report.index_problems:
        row("index vs shards", False, report.index_problems[0])
    if not report.file_errors:
        keys_ok = not (report.missing_keys or report.unexpected_keys)
        detail = (
            f"{len(report.missing_keys)} missing, {len(report.unexpected_keys)} unexpected"
            if not keys_ok
            else "all present" + (f"; expected missing: {', '.join(report.expected_missing)} (tied to the embeddings)" if report.expected_missing else "")
        )
        row("keys", keys_ok, detail)
        shape = [m for m in report.mismatched if m.kind == "shape"]
        row("shapes", not shape, f"{len(shape)} mismatch(es)" if shape else "all match the model")
        dt = [m for m in report.mismatched if m.kind == "dtype"]
        fatal_dt = [m for m in dt if m.fatal]
        if dt:
            kinds = sorted({f"{m.found}" for m in dt})
            row("dtypes", not fatal_dt, f"{len(dt)} tensor(s) stored as {'/'.join(kinds)}, config says {dt[0].expected}"
                + ("" if fatal_dt else " (loads fine: cast on load)"))
        else:
            row("dtypes", True, f"all {report.config_dtype}, as config.json says" if report.config_dtype else "config.json names no dtype to check")
        if report.round_trip:
            rt = report.round_trip
            if rt.get("skipped"):
                row("round trip", None, rt["skipped"])
            elif "loaded_problems" in rt:  # Qwen3-MoE: from_pretrained of the folder
                row("round trip", not rt.get("disagrees"),
                    f"{rt['model_class']}.from_pretrained (meta): "
                    + ("; ".join(rt["loaded_problems"])[:300] if rt["loaded_problems"] else f"loads, {rt.get('checked', '')}"))
            else:
                row("round trip", not rt.get("disagrees"),
                    f"{rt['model_class']}.load_state_dict(strict=False): missing {rt['missing_keys'][:3]}, unexpected {rt['unexpected_keys'][:3]}")
        if report.scanned:
            bad = report.nonfinite
            row("finite values", not bad, f"{len(bad)} tensor(s) with NaN/Inf" if bad else f"all {report.num_parameters:,} values finite")
        else:
            row("finite values", None, "--quick: not scanned")
    if report.compare:
        c = report.compare
        if "compared" in c:
            med, mx = c.get("median_rel_change"), c.get("max_rel_change")
            row("compare", not c["problems"], (
                f"{c['compared']} tensors vs {c['reference']}: median rel change {med:.3g}, max {mx:.3g}, "
                f"{len(c['unchanged'])} unchanged" if med is not None else f"{c['compared']} tensors compared")
                + (f"; {c['problems'][0]}" if c["problems"] else ""))
        else:
            row("compare", False, "; ".join(c["problems"]))
    if report.generate:
        g = report.generate
        row("generate", not g.get("error"), g.get("error") or f"[{g['device']}] {g['prompt']!r} -> {g['completion']!r}")

    table = Table(show_header=True, title_justify="left")
    for col in ("check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*r)
    out.print(table)

    for title, items in (
        ("Missing keys", report.missing_keys),
        ("Unexpected keys", report.unexpected_keys),
        ("Mismatches", [m.line() for m in report.fatal_mismatches]),
        ("Non-finite values", [f"{k}: {v['nan']:,} NaN, {v['inf']:,} Inf" for k, v in report.nonfinite_detail.items()]),
        ("Index", report.index_problems),
    ):
        if items:
            out.print(f"[bold]{title}[/bold] ({len(items)}):")
            for item in items[:SHOW]:
                out.print(f"  {item}", markup=False)
            if len(items) > SHOW:
                out.print(f"  ... and {len(items) - SHOW} more (--json lists all)")
    if report.ok:
        out.print("[green bold]OK[/green bold]: a standard HF checkpoint" + ("" if report.scanned else " (values not scanned: --quick)"))
