"""``trnqwen chat``: talk to an export in the terminal (in this process, or through an endpoint).

Examples:
  trnqwen chat                                         # the last run's export, loaded here
  trnqwen chat RUN_ID --system "You are terse." --temperature 0
  trnqwen chat --endpoint http://127.0.0.1:8000        # what `trnqwen serve` serves
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, DeviceOpt, user_paths

HELP = "Chat with a run's export in the terminal (loaded here, or through an OpenAI-compatible endpoint), answers streamed."
EPILOG = """\
Examples:

  trnqwen chat                                   # the last run's export, loaded in this process
  trnqwen chat RUN_ID --system "You are terse." --temperature 0
  trnqwen chat ./ckpt/hf/step-500 --no-enable-thinking --max-new-tokens 256
  trnqwen chat --endpoint http://127.0.0.1:8000  # the model `trnqwen serve` (or vLLM) serves

Each question is sent with the whole conversation, rendered by the model's chat template. At the
>>> prompt: /reset starts the conversation over (the system prompt stays), /exit, Ctrl-D or Ctrl-C
leaves; Ctrl-C during an answer stops it (it is not kept). --temperature 0 is greedy decoding (the
answer eval --generate gives). A LoRA adapter is loaded on its base (--base, as eval and serve
find it). With --endpoint the answers stream from its /v1/chat/completions (OPENAI_API_KEY is sent
as the key, if set); piped input (echo hi | trnqwen chat) prints the answers alone.
Exit 0 (left the chat), 2 usage error (no such run or export, no chat template), 3 nothing answers
at --endpoint.
"""


def chat(
    target: Annotated[
        Optional[str],
        typer.Argument(
            metavar="[RUN|FOLDER]",
            help="A run id, a run directory, or an export folder (hf/step-N; a LoRA run's is its adapter). "
            "[default: the last run's export]",
            show_default=False,
        ),
    ] = None,
    endpoint: Annotated[
        Optional[str],
        typer.Option("--endpoint", metavar="URL", help="An OpenAI-compatible server to chat through (trnqwen serve, "
                     "vLLM) instead of loading the model here.", show_default=False),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option("--model", metavar="NAME", help="With --endpoint: the served model to ask. [default: the one it "
                     "lists; an adapter beside its base]", show_default=False),
    ] = None,
    base: Annotated[
        Optional[Path],
        typer.Option(
            "--base",
            help="With a LoRA adapter: its base model's snapshot. [default: the run's assets, else "
            "adapter_config.json's base_model_name_or_path]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    system: Annotated[
        Optional[str], typer.Option("--system", metavar="TEXT", help="A system prompt, first in every conversation.",
                                    show_default=False)
    ] = None,
    temperature: Annotated[
        Optional[float],
        typer.Option("--temperature", min=0.0, help="Sampling temperature; 0 is greedy. [default: the model's "
                     "generation_config.json, or the server's]", show_default=False),
    ] = None,
    top_p: Annotated[
        Optional[float],
        typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling's probability mass. [default: the model's, "
                     "or the server's]", show_default=False),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens per answer at most.")] = 512,
    enable_thinking: Annotated[
        Optional[bool],
        typer.Option("--enable-thinking/--no-enable-thinking", help="Qwen3's thinking, passed to the chat template. "
                     "[default: the template's]", show_default=False),
    ] = None,
    device: DeviceOpt = None,
    config_file: ConfigFileOpt = None,
) -> None:
    """Chat with an export."""
    from trnqwen import output
    from trnqwen.chat.engines import open_engine
    from trnqwen.chat.session import COMMANDS_LINE, ChatSession, Sampling, run_chat, terminal_io
    from trnqwen.cli._options import given
    from trnqwen.config import resolve_config

    resolved = resolve_config(given(device=device), config_file=config_file,
                              uses={"runs_dir", "device", "trust_remote_code"})
    for w in resolved.warnings:
        output.warn(w)
    cfg = resolved.config
    io = terminal_io()
    engine = open_engine(target, runs_dir=Path(cfg.runs_dir), endpoint=endpoint, model=model, base=base,
                         device=cfg.device, trust_remote_code=cfg.trust_remote_code,
                         on_load=lambda t: io.note(f"loading {t.label} ..."))
    io.note(f"chatting with {engine.description}; {COMMANDS_LINE}")
    sampling = Sampling(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                        enable_thinking=enable_thinking)
    run_chat(engine, ChatSession(system=system), sampling, io)
