"""``trnqwen fetch``: download a Hub snapshot that arrives whole, or write the built-in tiny Qwen3.

Examples:
  trnqwen fetch Qwen/Qwen3-4B-Instruct-2507
  trnqwen fetch Qwen/Qwen3-4B-Instruct-2507 --dry-run
  trnqwen fetch builtin:tiny-qwen3 --local-dir ./assets/hf/tiny-qwen3
  trnqwen fetch Qwen/Qwen3-0.6B --revision main --include '*.json' --include '*.safetensors' --json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, DryRunOpt, JsonOpt, given

HELP = "Download a Qwen3 snapshot from the Hub (or write builtin:tiny-qwen3), then verify it."
EPILOG = (
    "Examples:\n\n"
    "  trnqwen fetch Qwen/Qwen3-4B-Instruct-2507\n\n"
    "  trnqwen fetch Qwen/Qwen3-4B-Instruct-2507 --dry-run\n\n"
    "  trnqwen fetch builtin:tiny-qwen3 --local-dir ./assets/hf/tiny-qwen3\n\n"
    "  trnqwen fetch Qwen/Qwen3-0.6B --include '*.json' --include '*.safetensors' --json\n\n"
    "Default files: config, generation config, tokenizer files and safetensors (no .bin, no original/). "
    "A rerun completes an interrupted download and never downloads a verified file again. "
    "Uses HF_TOKEN / `hf auth login`, HF_ENDPOINT and HF_HUB_OFFLINE like `hf download`. "
    "Exit 0: verified; 1: downloaded but not verified; 2: bad input; 3: network, access, offline or disk."
)

RepoArg = Annotated[
    Optional[str],
    typer.Argument(
        metavar="REPO",
        help="Hub repo id (e.g. Qwen/Qwen3-4B-Instruct-2507) or builtin:tiny-qwen3 (a 1M-parameter Qwen3 with "
        "random weights, written offline). "
        "[default: the config's model, TRNQWEN_MODEL]",
        show_default=False,
    ),
]
LocalDirOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--local-dir",
        metavar="DIR",
        help="Where the snapshot goes. Env: TRNQWEN_ASSETS_DIR. [default: ./assets/hf/<model name>, where train looks]",
        show_default=False,
    ),
]
RevisionOpt = Annotated[
    Optional[str],
    typer.Option("--revision", metavar="REV", help="Branch, tag or commit. [default: main]", show_default=False),
]
IncludeOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--include",
        metavar="GLOB",
        help="Glob of files to get (repeatable); replaces the default allow-list and its excludes.",
        show_default=False,
    ),
]
ExcludeOpt = Annotated[
    Optional[list[str]],
    typer.Option("--exclude", metavar="GLOB", help="Glob of files to skip (repeatable); adds to the default excludes.", show_default=False),
]
MaxWorkersOpt = Annotated[
    Optional[int], typer.Option("--max-workers", min=1, metavar="N", help="Parallel file downloads. [default: 8]", show_default=False)
]
KeepFreeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--keep-free",
        metavar="SIZE",
        help="Refuse to start unless this much disk stays free after the download (e.g. 10G, 0). [default: 256M]",
        show_default=False,
    ),
]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="No progress bars (stderr).")]


def fetch(
    repo_id: RepoArg = None,
    local_dir: LocalDirOpt = None,
    revision: RevisionOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    max_workers: MaxWorkersOpt = None,
    keep_free: KeepFreeOpt = None,
    dry_run: DryRunOpt = False,
    no_progress: NoProgressOpt = False,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """Fetch and verify a model snapshot."""
    from pathlib import Path as _Path

    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.errors import UsageError
    from trnqwen.fetch.download import fetch
    from trnqwen.fetch.plan import DEFAULT_KEEP_FREE, DEFAULT_MAX_WORKERS, FetchResult
    from trnqwen.units import format_bytes, parse_size

    resolved = resolve_config(
        given(model=repo_id, assets_dir=local_dir),
        config_file=config_file,
        labels={"model": "argument REPO", "assets_dir": "flag --local-dir"},
    )
    for w in resolved.warnings:
        output.warn(w)
    cfg = resolved.config
    model = cfg.model
    if not cfg.is_builtin and _Path(model).expanduser().is_dir():
        raise UsageError(f"{model} is a local folder: nothing to fetch", hint="pass it to train with --assets-dir")
    target = cfg.resolved_assets_dir

    def show_plan(plan: FetchResult) -> None:
        if json_out or not plan.dry_run:
            return
        output.table(
            f"{plan.repo_id} @ {plan.commit or plan.revision} -> {plan.local_dir}",
            ["file", "size", "status"],
            [
                (name, format_bytes(plan.sizes[name]) if name in plan.sizes else "?",
                 "download" if name in plan.to_download else "present")
                for name in plan.files
            ],
        )

    result = fetch(
        model,
        _Path(target),
        revision=revision,
        include=include,
        exclude=exclude,
        max_workers=max_workers or DEFAULT_MAX_WORKERS,
        dry_run=dry_run,
        keep_free=parse_size(keep_free) if keep_free is not None else DEFAULT_KEEP_FREE,
        progress=not no_progress,
        on_plan=show_plan,
    )
    if json_out:
        output.print_json(result.as_dict())
    else:
        _render(result)
    if result.dry_run:
        return 0
    return 0 if result.verified else 1


def _render(result) -> None:
    from rich.markup import escape

    from trnqwen import output
    from trnqwen.units import format_bytes

    for w in result.warnings:
        output.warn(w)
    if result.dry_run:
        if result.repo_id.startswith("builtin:"):
            state = "present and verified" if result.verified else "would be written (offline)"
            output.result(f"dry run: {result.repo_id} {state} in {result.local_dir}")
        else:
            output.result(
                f"dry run: {len(result.files)} files, {format_bytes(result.bytes)} in total; "
                f"{len(result.to_download)} to download; nothing written"
            )
        return
    for p in result.problems:
        output.console().print(f"[red]problem:[/red] {p}")
    if result.verified:
        what = "downloaded" if result.to_download else "already complete, nothing downloaded"
        if result.repo_id.startswith("builtin:"):
            what = "written" if result.to_download else "already present"
        output.result(  # the verdict and the folder written: stdout, for scripts
            f"[green]ok[/green] {escape(result.repo_id)} -> {escape(str(result.local_dir))} ({len(result.files)} files, "
            f"{format_bytes(result.bytes)}, {what}; verified)", markup=True,
        )
    else:
        output.result(
            f"[red]not verified[/red]: {escape(str(result.local_dir))} is not a complete snapshot of "
            f"{escape(result.repo_id)}; run the same command again to repair it", markup=True,
        )
