"""``trnqwen inspect-logs``: read a torchtitan run's log and judge it.

Examples:
  trnqwen inspect-logs                       # the last run (<runs_dir>/LAST)
  trnqwen inspect-logs .trnqwen/runs/20261129-090800-hf-v5-sft --strict
  trnqwen inspect-logs train.log --json | jq .summary
  trnqwen inspect-logs train.log --plot loss.png --csv steps.csv
  trnqwen inspect-logs run_a.log --compare run_b.log
  trnqwen inspect-logs --follow
  torchrun ... 2>&1 | trnqwen inspect-logs -
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from trnqwen.cli._base_options import ConfigFileOpt, JsonOpt, user_paths  # not _options: no pydantic for a log path
from trnqwen.output import number

if TYPE_CHECKING:
    from trnqwen.logs.record import ParsedLog

HELP = "Read a torchtitan training log (file, run dir, stdin; default: the last run) and judge the run."
EPILOG = """\
Examples:

  trnqwen inspect-logs                           # the last run
  trnqwen inspect-logs train.log --json
  trnqwen inspect-logs a.log --compare b.log
  trnqwen inspect-logs --follow                  # a run still going, until it ends
  trnqwen inspect-logs RUN_DIR --plot loss.png

Exit 1 when an error finding exists (--no-strict: 0).
"""


def inspect_logs(
    logs: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Log files (.gz, .bz2, .xz read too), run directories, or - for stdin. Default: the last run's train.log.",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    json_out: JsonOpt = False,
    csv_file: Annotated[Optional[Path], typer.Option("--csv", help="Write one CSV row per step to FILE.", show_default=False)] = None,
    plot_file: Annotated[
        Optional[Path], typer.Option("--plot", help="Write a PNG of loss, grad norm, tps/MFU and learning rate against step.", show_default=False)
    ] = None,
    compare: Annotated[
        Optional[str], typer.Option("--compare", help="A second log or run dir: per-step losses side by side with their difference.", show_default=False)
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Watch a live log until the run ends (or Ctrl-C), then judge it.")] = False,
    strict: Annotated[
        bool, typer.Option("--strict/--no-strict", help="Exit 1 when any error-level finding exists; --no-strict: exit 0 whatever was found.")
    ] = True,
    expect_layers: Annotated[
        Optional[int],
        typer.Option("--expect-layers", min=1, help="Model layers: each override should appear once per layer. [default: from the run's model config]", show_default=False),
    ] = None,
    vocab_size: Annotated[
        Optional[int],
        typer.Option("--vocab-size", min=2, help="Vocabulary size for the random-init loss check. [default: from the run's model config]", show_default=False),
    ] = None,
    finetune: Annotated[
        Optional[bool],
        typer.Option("--finetune/--from-scratch", help="Whether the run should have started from pretrained weights. [default: from the run record, or guessed from checkpoint lines]", show_default=False),
    ] = None,
    idle_timeout: Annotated[
        float, typer.Option("--idle-timeout", min=1.0, help="--follow: give up after this many seconds without new log lines (a stalled error, exit 1).")
    ] = 600.0,
    config_file: ConfigFileOpt = None,
) -> None:
    """Read a torchtitan training log and judge the run."""
    from trnqwen.errors import UsageError
    from trnqwen.logs.sources import resolve_input

    args = list(logs or [])
    runs_dir = None
    if not args or (compare is not None and not Path(compare).exists() and compare != "-"):
        from trnqwen.config import resolve_config

        runs_dir = resolve_config({}, config_file=config_file, uses={"runs_dir"}).config.runs_dir
    inputs = [resolve_input(a, runs_dir) for a in args] if args else [resolve_input(None, runs_dir)]
    if sum(1 for i in inputs if i.is_stdin) > 1:
        raise UsageError("stdin (-) can be read only once", hint="pass - at most once")
    if len(inputs) > 1 and (csv_file or plot_file or compare or follow):
        raise UsageError("--csv, --plot, --compare and --follow take one log", hint="pass a single log with these options")
    for out in (csv_file, plot_file):
        for inp in inputs:
            if out is not None and inp.path is not None and _same_file(out, inp.path):
                raise UsageError(f"{out} is the log being read", hint="write --csv/--plot output to another file")
    for flag, out, example in (("--csv", csv_file, "steps.csv"), ("--plot", plot_file, "loss.png")):
        if out is not None:  # before reading the log: say what is wrong with the path, not with a temp file
            _check_output(flag, out, example)
    if plot_file is not None and plot_file.suffix.lower() not in (".png", ".svg", ".pdf", ".jpg", ".jpeg"):
        raise UsageError(f"--plot {plot_file}: use a .png (or .svg/.pdf/.jpg) file name", hint="e.g. --plot loss.png")
    judge_kw = {"expect_layers": expect_layers, "vocab_size": vocab_size, "finetune": finetune}
    if follow:
        _run_follow(inputs[0], json_out, csv_file, plot_file, strict, idle_timeout, judge_kw)
        return
    if compare is not None:
        _run_compare(inputs[0], resolve_input(compare, runs_dir), json_out, csv_file, plot_file, judge_kw)
        return
    _run_inspect(inputs, json_out, csv_file, plot_file, strict, judge_kw)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and a.samefile(b))
    except OSError:
        return False


def _run_inspect(inputs, json_out, csv_file, plot_file, strict, judge_kw) -> None:
    from trnqwen.logs import core, report

    results = [core.inspect_input(inp, **judge_kw) for inp in inputs]
    _write_files(results[0], csv_file, plot_file)
    if json_out:
        if len(results) == 1:
            r = results[0]
            report.write_json(report.json_text(r.log, r.ctx, r.findings))
        else:
            objs = [json.loads(report.json_text(r.log, r.ctx, r.findings)) for r in results]
            report.write_json({
                "logs": objs,
                "findings": [dict(f, source=o["source"]) for o in objs for f in o["findings"]],
                "summary": {"logs": len(objs), "errors": sum(1 for r in results if r.has_errors)},
            })
    else:
        for r in results:
            report.render(r.log, r.ctx, r.findings)
    _finish(results, strict)


def _check_output(flag: str, out: Path, example: str) -> None:
    """An output path that cannot be a file: a folder, or a path through a file."""
    from trnqwen.errors import UsageError

    if out.is_dir():
        raise UsageError(f"{flag} {out} is a folder", hint=f"pass a file name, e.g. {flag} {out / example}")
    for parent in out.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise UsageError(f"{flag} {out}: {parent} is a file, not a folder", hint=f"write {flag} into a folder")
            return


class _Writing:
    """Writing ``path`` for ``flag``: an OSError (from the temp file beside it, or the rename)
    becomes one line about ``path`` itself, never the temp file's name."""

    def __init__(self, flag: str, path: Path):
        self.flag, self.path = flag, path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        import errno

        from trnqwen.errors import EnvironmentProblem, UsageError

        if exc is None or not isinstance(exc, OSError) or isinstance(exc, BrokenPipeError):
            return False
        what = exc.strerror or str(exc)
        where = f"{self.flag} {self.path}"
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise EnvironmentProblem(f"cannot write {where}: disk full", hint="free space there (df -h) or write elsewhere") from None
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise EnvironmentProblem(f"cannot write {where}: {what}", hint="pick a writable folder") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(f"cannot write {where}: the file name is too long", hint="use a shorter file name") from None
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            raise UsageError(f"cannot write {where}: a part of the path is a file, not a folder", hint="check the path") from None
        raise UsageError(f"cannot write {where}: {what}", hint="check the path") from None


def _write_files(result, csv_file, plot_file) -> None:
    from trnqwen import output
    from trnqwen.logs import report

    if csv_file is not None:
        with _Writing("--csv", csv_file):
            report.write_csv(result.log, csv_file)
        output.info(f"wrote {csv_file} ({len(result.log.steps)} steps)")
    if plot_file is not None:
        from trnqwen.logs.plot import run_plot_title, write_plot

        with _Writing("--plot", plot_file):
            write_plot(result.log, plot_file, evaluations=[result.ctx.evaluation],
                       title=run_plot_title(result.log, result.ctx))
        output.info(f"wrote {plot_file}")


def _finish(results, strict: bool) -> None:
    """A run with error findings (a NaN loss, a crash, unloaded weights) must not look clean to a
    script: exit 1, unless --no-strict."""
    if strict and any(r.has_errors for r in results):
        from trnqwen.errors import CheckFailed

        n = sum(1 for r in results for f in r.findings if f.severity == "error")
        raise CheckFailed(f"{n} error-level finding(s)", hint="see the findings above; --no-strict exits 0 anyway")


def _run_compare(a_inp, b_inp, json_out, csv_file, plot_file, judge_kw) -> None:
    from trnqwen import output
    from trnqwen.logs import core, report

    a = core.inspect_input(a_inp, **judge_kw)
    b = core.inspect_input(b_inp, **judge_kw)
    cmp = _compare(a.log, b.log)
    cmp["evaluation"] = {"a": a.ctx.evaluation or None, "b": b.ctx.evaluation or None}  # trnqwen eval, when run
    if csv_file is not None:
        import csv
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(cmp["steps"][0].keys()) if cmp["steps"] else ["step"], lineterminator="\n")
        w.writeheader()
        for row in cmp["steps"]:
            w.writerow({k: ("" if v is None else v) for k, v in row.items()})
        from trnqwen.fsutil import write_text_atomic

        with _Writing("--csv", csv_file):
            write_text_atomic(csv_file, buf.getvalue())
        output.info(f"wrote {csv_file}")
    if plot_file is not None:
        from trnqwen.logs.plot import run_plot_title, write_plot

        title = f"A: {run_plot_title(a.log, a.ctx)}\nB: {run_plot_title(b.log, b.ctx)}"
        with _Writing("--plot", plot_file):
            write_plot(a.log, plot_file, other=b.log, evaluations=[a.ctx.evaluation, b.ctx.evaluation], title=title)
        output.info(f"wrote {plot_file}")
    if json_out:
        cmp["a_summary"] = report.summarize(a.log, a.ctx)
        cmp["b_summary"] = report.summarize(b.log, b.ctx)
        cmp["findings"] = [dict(f.as_dict(), source="a") for f in a.findings] + [dict(f.as_dict(), source="b") for f in b.findings]
        output.print_json(cmp)
    else:
        _render_compare(cmp)


def _compare(a: "ParsedLog", b: "ParsedLog") -> dict:
    """--compare: per-step losses side by side and their difference (like torchtitan's loss comparison)."""
    rows = []
    for st in sorted(set(a.steps) | set(b.steps)):
        ra, rb = (log.steps[st] if st in log.steps else {} for log in (a, b))
        la, lb = ra.get("loss"), rb.get("loss")
        both = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (la, lb))
        rows.append({"step": st, "loss_a": _finite(la), "loss_b": _finite(lb), "loss_diff": lb - la if both else None,
                     **{f"{k}_{side}": r.get(k) for k in ("tps", "memory_gib") for side, r in (("a", ra), ("b", rb))}})
    diffs = [r["loss_diff"] for r in rows if r["loss_diff"] is not None]
    return {"a": a.source, "b": b.source, "steps": rows, "common_steps": len(diffs),
            "max_abs_loss_diff": max((abs(d) for d in diffs), default=None),
            "mean_loss_diff": sum(diffs) / len(diffs) if diffs else None,
            "identical": bool(diffs) and all(d == 0 for d in diffs)}


def _finite(x: Optional[float]) -> Optional[float]:
    """JSON-safe: NaN/Inf become None."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _render_compare(cmp: dict) -> None:
    from rich.table import Table

    from trnqwen import output
    from trnqwen.logs.report import render_evaluation

    con = output.console(stderr=False)
    t = Table(title=f"compare: A = {cmp['a']}   B = {cmp['b']}", title_justify="left")
    for col in ("step", "loss A", "loss B", "B - A", "tps A", "tps B", "mem A GiB", "mem B GiB"):
        t.add_column(col, justify="right")
    for r in cmp["steps"]:
        d = r["loss_diff"]
        dtxt = "-" if d is None else f"{d:+.5f}"
        if d is not None and abs(d) > 1e-3:
            dtxt = f"[yellow]{dtxt}[/yellow]"
        t.add_row(str(r["step"]), number(r["loss_a"], ".5f"), number(r["loss_b"], ".5f"), dtxt,
                  number(r["tps_a"], ","), number(r["tps_b"], ","), number(r["memory_gib_a"], ".2f"), number(r["memory_gib_b"], ".2f"))
    con.print(t)
    if cmp["common_steps"]:
        verdict = "identical losses" if cmp["identical"] else f"max |B - A| = {cmp['max_abs_loss_diff']:.6f}, mean B - A = {cmp['mean_loss_diff']:+.6f}"
        con.print(f"{cmp['common_steps']} common step(s): {verdict}")
    else:
        con.print("no step is in both logs")
    for side in ("a", "b"):
        render_evaluation((cmp.get("evaluation") or {}).get(side) or {}, console=con, label=f" ({side.upper()})")


def _run_follow(inp, json_out, csv_file, plot_file, strict, idle_timeout, judge_kw) -> None:
    from trnqwen import output
    from trnqwen.logs import core, report

    con = output.console()  # live lines on stderr

    def on_step(s: dict) -> None:
        parts = [f"step {s['step']:>5}", f"loss {number(s.get('loss'), '.5f')}", f"grad {number(s.get('grad_norm'), '.4f')}"]
        if s.get("memory_gib") is not None:
            parts.append(f"mem {number(s.get('memory_gib'), '.2f')}GiB({number(s.get('memory_pct'), '.1f')}%)")
        parts.append(f"tps {number(s.get('tps'), ',')}")
        if s.get("mfu") is not None:
            parts.append(f"mfu {number(s.get('mfu'), '.2f')}%")
        else:
            parts.append("mfu -")  # no peak FLOPS known for the device (CPU): torchtitan's 0.00% says nothing
        if s.get("lr") is not None:
            parts.append(f"lr {number(s.get('lr'), '.4g')}")
        parts += [f"{k} {number(v, '.4g')}" for k, v in s.items() if k not in _SHOWN and v is not None]  # by name
        con.print("  ".join(parts), highlight=False)

    def on_validation(v: dict) -> None:
        parts = [f"validation after step {v['step']}", f"loss {number(v.get('loss'), '.5f')}"]
        if v.get("tps") is not None:
            parts.append(f"tps {number(v.get('tps'), ',')}")
        parts += [f"{k} {number(x, '.4g')}" for k, x in v.items() if k not in _SHOWN and x is not None]
        con.print("  ".join(parts), highlight=False)

    output.info(f"following {inp.label} (Ctrl-C to stop)")
    result = core.follow(inp, on_step=on_step, on_validation=on_validation, idle_timeout_s=idle_timeout, **judge_kw)
    if any(f.code == "stalled" for f in result.findings):
        output.warn(f"stopped following: no new log line for {idle_timeout:g} s (--idle-timeout)")
    _write_files(result, csv_file, plot_file)
    if json_out:
        report.write_json(report.json_text(result.log, result.ctx, result.findings))
    else:
        report.render(result.log, result.ctx, result.findings)
    _finish([result], strict)


# what --follow's lines show by their own labels; any other value of a step is shown by its name
_SHOWN = frozenset(("step", "loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops", "mfu", "lr", "line", "source"))
