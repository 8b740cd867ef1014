"""``trnqwen serve``: an OpenAI-compatible server for an export (a whole model, or base + adapter).

Examples:
  trnqwen serve                                            # the last run's export
  trnqwen serve RUN_ID --port 8080
  trnqwen serve ./checkpoint_qwen3_4b_ft/hf/step-500 --engine vllm --dry-run --json
  trnqwen serve RUN_ID --k8s serve.yaml --image IMAGE      # a Deployment + Service for EKS (vLLM Neuron)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, JsonOpt, user_paths

HELP = "Serve a run's export (a whole model, or a LoRA adapter on its base) on an OpenAI-compatible endpoint."
EPILOG = """\
Examples:

  trnqwen serve                                  # the last run's export
  trnqwen serve RUN_ID --port 8080
  trnqwen serve ./checkpoint_qwen3_4b_ft/hf/step-500 --engine vllm --dry-run
  trnqwen serve RUN_ID --k8s manifests/ --image <registry>/<vllm-neuron-image>:<tag>   # EKS

The engine is vLLM Neuron (`vllm serve`) where a Neuron device is present, transformers' own
`transformers serve` elsewhere (pip install 'trnqwen[serve]'). With vllm: tensor parallel over the
logical NeuronCores, --max-model-len from the run's seq_len, an adapter through --enable-lora
--lora-modules after vLLM's LoRA rules (rank 1/8/16/32/64/128/256/320/512, attention and MLP
projections only, no modules_to_save, no DoRA), the compile cache in VLLM_CACHE_ROOT. With
transformers an adapter is served merged into its base (<adapter>.merged, written once).
Waits until the endpoint answers, prints its URL and a curl line; Ctrl-C stops the server.
--k8s FILE|DIR writes the vLLM Neuron server as a Kubernetes Deployment + Service instead (the model
folder on the shared PVC at /shared, Neuron devices for its tensor parallel, probes on /health) and
prints the kubectl lines to apply and reach it; nothing starts here.
Exit 0 (server exited cleanly), 1 the adapter breaks a vLLM rule or the server died, 2 usage error,
3 the engine is not installed or the port is taken, 130/143 stopped by SIGINT/SIGTERM.
"""


def serve(
    target: Annotated[
        Optional[str],
        typer.Argument(
            metavar="[RUN|FOLDER]",
            help="A run id, a run directory, or an export folder (hf/step-N; a LoRA run's is its adapter). "
            "[default: the last run's export]",
            show_default=False,
        ),
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
    port: Annotated[int, typer.Option("--port", help="The TCP port to listen on.", min=1, max=65535)] = 8000,
    host: Annotated[str, typer.Option("--host", help="The address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    engine: Annotated[
        Optional[str],
        typer.Option("--engine", metavar="transformers|vllm",
                     help="The server. [default: vllm where a Neuron device is present, else transformers]",
                     show_default=False),
    ] = None,
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", metavar="SECONDS", help="How long to wait for the endpoint to answer.", min=1)
    ] = 1800.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command (after every check) and start nothing.")] = False,
    k8s: Annotated[
        Optional[Path],
        typer.Option("--k8s", metavar="FILE|DIR",
                     help="Write a Kubernetes Deployment + Service running vLLM Neuron for this export (DIR: "
                     "DIR/serve.yaml) instead of serving here.", show_default=False),
    ] = None,
    image: Annotated[
        Optional[str],
        typer.Option("--image", help="With --k8s: the container image with vLLM Neuron (an AWS Neuron vLLM DLC). "
                     "[default: image in trnqwen.toml]", show_default=False),
    ] = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Serve an export on an OpenAI-compatible endpoint."""
    import sys

    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.serve.plan import plan_serve

    resolved = resolve_config({}, config_file=config_file, uses={"runs_dir", "assets_dir", "trust_remote_code", "model",
                                                                 "compile_cache_dir", "image", "lnc"})
    for w in resolved.warnings:
        output.warn(w)
    cfg = resolved.config
    if k8s is not None:
        _write_k8s(target, cfg, base=base, engine=engine, port=port, out=k8s, image=image, ready_timeout=ready_timeout,
                   json_out=json_out)
        return
    plan = plan_serve(target, cfg=cfg, base=base, engine=engine.strip().lower() if engine else None, host=host, port=port)
    if dry_run:
        if json_out:
            output.print_json({"ok": True, "dry_run": True, **plan.as_dict()})
        else:
            for note in plan.notes:
                output.info(note)
            output.result(plan.command_line())
        return

    from trnqwen.serve.process import prepare, run_server

    def merging(p) -> None:
        output.info(f"merging the adapter {p.adapter} into {p.base} -> {p.served} (served merged: transformers serve loads no adapter)")

    prepare(plan, runs_dir=cfg.runs_dir, on_merge=merging)
    for note in plan.notes:
        output.info(note)
    output.info(f"starting {plan.engine}: {plan.command_line()}")

    def ready(p, seconds: float) -> None:
        if json_out:
            output.print_json({"ok": True, "ready_s": round(seconds, 1), **p.as_dict()})
        else:
            output.result(f"serving {p.model} at {p.url}/v1 (ready in {seconds:.1f}s); Ctrl-C stops it")
            output.result(f"try: {p.curl()}")
        sys.stdout.flush()

    def log(line: str) -> None:
        sys.stderr.write(line + "\n")

    code = run_server(plan, ready_timeout=ready_timeout, on_ready=ready, log=log)
    if code:
        raise typer.Exit(code)


def _write_k8s(target, cfg, *, base, engine, port, out, image, ready_timeout, json_out) -> None:
    """--k8s: the vLLM plan for a Trainium node, written as a Deployment + Service."""
    from trnqwen import output
    from trnqwen.errors import UsageError
    from trnqwen.serve.k8s import NODE_LOGICAL_CORES, write
    from trnqwen.serve.plan import plan_serve

    if engine and engine.strip().lower() != "vllm":
        raise UsageError("--k8s writes the vLLM Neuron server's manifest", hint="drop --engine (or say --engine vllm)")
    plan = plan_serve(target, cfg=cfg, base=base, engine="vllm", host="0.0.0.0", port=port, device_type="neuron",
                      cores=NODE_LOGICAL_CORES)
    info = write(plan, cfg, out, image=image, ready_timeout_s=ready_timeout)
    if json_out:
        output.print_json({"ok": True, **info})
        return
    for note in info["notes"]:
        output.info(note)
    output.result(f"wrote {info['manifest']} ({' + '.join(info['kinds'])} {info['name']}, image {info['image']})")
    output.result(f"apply:  {info['apply']}")
    output.result(f"wait:   {info['wait']}")
    output.result(f"reach:  {info['port_forward']}  # then {info['url']}/v1, model {info['model']}")
