"""``trnqwen push``: upload a verified export (a whole model or a LoRA adapter) to a Hub repo.

Examples:
  trnqwen push --repo my-org/qwen3-4b-chat                 # the last run's export
  trnqwen push 20260101-120000-ab12 --repo my-org/qwen3-4b-chat-lora --private
  trnqwen push ./checkpoint_qwen3_4b_ft/hf/step-500 --repo my-org/qwen3-4b-chat --revision v1 --json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, JsonOpt, user_paths

HELP = "Upload a run's export (a whole model folder or a LoRA adapter, with its model card) to a Hugging Face Hub repo."
EPILOG = """\
Examples:

  trnqwen push --repo my-org/qwen3-4b-chat                 # the last run's export
  trnqwen push RUN_ID --repo my-org/qwen3-4b-chat-lora --private
  trnqwen push ./checkpoint_qwen3_4b_ft/hf/step-500 --repo my-org/qwen3-4b-chat --revision v1 --json

verify-ckpt's checks run first: an export that fails them, or a LoRA adapter that is untrained
(every lora_B zero), is not pushed. The repo is created when missing. The token is HF_TOKEN's or
`hf auth login`'s and the endpoint HF_ENDPOINT's, as for `hf upload`; the token is never printed.
`train --push-to-hub OWNER/NAME` pushes a run's export when it finishes. Exit 0 pushed, 1 the
export failed a check, 2 usage error (bad --repo, no such run or folder), 3 no token, offline,
network or Hub refusal.
"""


def push(
    target: Annotated[
        Optional[str],
        typer.Argument(
            metavar="[RUN|FOLDER]",
            help="A run id, a run directory, a checkpoint folder or an export folder (hf/step-N; a LoRA run's is "
            "its adapter). [default: the last run's export]",
            show_default=False,
        ),
    ] = None,
    repo: Annotated[
        str,
        typer.Option("--repo", metavar="OWNER/NAME", help="The Hub model repo to push to (created when missing).",
                     show_default=False),
    ] = ...,
    private: Annotated[bool, typer.Option("--private", help="Create the repo private (an existing repo keeps its visibility).")] = False,
    revision: Annotated[
        Optional[str],
        typer.Option("--revision", metavar="REV", help="The branch to commit to (created from main when missing). [default: main]",
                     show_default=False),
    ] = None,
    base: Annotated[
        Optional[Path],
        typer.Option(
            "--base",
            help="With a LoRA adapter: the base model's snapshot it is verified against. "
            "[default: the run's assets, else adapter_config.json's base_model_name_or_path]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Push an export to the Hub."""
    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.hub.push import CARD, push as push_export
    from trnqwen.units import format_bytes

    resolved = resolve_config({}, config_file=config_file, uses={"runs_dir", "assets_dir", "trust_remote_code", "model"})
    for w in resolved.warnings:
        output.warn(w)

    def announce(folder: Path, kind: str, files: list[Path]) -> None:
        if not any(p.name == CARD for p in files):
            output.warn(f"{folder} has no {CARD}: the repo gets no model card")
        if not json_out:
            size = format_bytes(sum(p.stat().st_size for p in files))
            output.info(f"verified; pushing the {kind} {folder} ({len(files)} files, {size}) to {repo}")

    result = push_export(target, repo, cfg=resolved.config, private=private, revision=revision, base=base,
                         progress=not json_out, before_upload=announce)
    if json_out:
        output.print_json(result.as_dict())
    else:
        output.result(f"pushed {len(result.files)} files ({format_bytes(result.bytes)}) to {result.url} "
                      f"@ {result.revision}: {result.commit_url}")
