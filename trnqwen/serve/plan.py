"""What ``trnqwen serve`` starts, decided before anything starts (``--dry-run`` prints it).

1. what to serve: RUN|FOLDER resolved as ``trnqwen push`` and ``trnqwen eval`` resolve it
   (:func:`trnqwen.evaluate.targets.resolve_target`: a run id, a run directory, an export folder;
   none: the last run's export): a whole model folder, or a LoRA adapter and its base;
2. the engine: ``vllm`` where a Neuron device is present (the probe check-env uses, which never
   claims a core), ``transformers`` elsewhere;
3. vllm: ``vllm serve BASE_OR_MODEL`` with tensor parallel from the logical NeuronCores (capped
   to a divisor of the attention heads, which vLLM requires), ``--max-model-len`` from the run's
   seq_len (else config.json's max_position_embeddings), an adapter as
   ``--enable-lora --max-lora-rank R --lora-modules NAME=PATH`` after vLLM's LoRA rules
   (:func:`vllm_lora_problems`), and the compile cache in ``VLLM_CACHE_ROOT`` (vLLM Neuron keeps
   its NEFFs under ``$VLLM_CACHE_ROOT/neuron/compile_cache``);
4. transformers: ``transformers serve FOLDER`` (its OpenAI-compatible FastAPI server); an adapter
   is served merged into its base (``trnqwen merge``'s ``hf/step-N.merged`` beside it, reused when
   it is already there).

Nothing here imports torch or writes a file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.errors import CheckFailed, EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.evaluate.targets import EvalTarget

ENGINES = ("transformers", "vllm")
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
# vLLM's --max-lora-rank accepts these values only (vllm.config.lora: possible_max_ranks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The Qwen3 modules vLLM's LoRA layers replace (it packs q/k/v into qkv_proj, gate/up into gate_up_proj).
VLLM_LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VLLM_CACHE_VAR = "VLLM_CACHE_ROOT"
DEFAULT_COMPILE_CACHE = Path(".trnqwen") / "neff-cache"
VLLM_INSTALL_HINT = ("install vLLM Neuron on the Trainium host (the Neuron DLC ships it; "
                     "https://awsdocs-neuron.readthedocs-hosted.com: vLLM Neuron), or serve with --engine transformers")
TRANSFORMERS_INSTALL_HINT = "pip install 'trnqwen[serve]' (transformers' serving extras: fastapi, uvicorn, openai)"


@dataclass
class ServePlan:
    """One server, as data: the command, the variables it adds, and what it serves."""

    engine: str
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    model: str  # the name clients pass as "model"
    served: Path  # the folder the engine loads (the merged folder for an adapter on transformers)
    kind: str  # "model" or "adapter"
    adapter: Optional[Path] = None
    base: Optional[Path] = None
    merge_needed: bool = False  # transformers + adapter: `served` is still to be written
    tensor_parallel: Optional[int] = None
    max_model_len: Optional[int] = None
    notes: list[str] = field(default_factory=list)  # why each setting is what it is

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def command_line(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        return f"{prefix} {cmd}" if prefix else cmd

    def curl(self) -> str:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})
        return f"curl {self.url}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "command": self.argv, "env": self.env, "command_line": self.command_line(),
            "url": self.url, "host": self.host, "port": self.port, "model": self.model, "served": str(self.served),
            "kind": self.kind, "adapter": str(self.adapter) if self.adapter else None,
            "base": str(self.base) if self.base else None, "merge_needed": self.merge_needed,
            "tensor_parallel": self.tensor_parallel, "max_model_len": self.max_model_len, "notes": self.notes,
        }


# --- vLLM's LoRA rules ---------------------------------------------------------------------------


def adapter_modules(adapter: Path) -> set[str]:
    """The leaf names of the modules an adapter's weights adapt (``q_proj``, ``embed_tokens``...),
    read from the safetensors header (no tensor loaded)."""
    from trnqwen.assets import ADAPTER_WEIGHTS
    from trnqwen.safetensors_format import read_header

    path = adapter / ADAPTER_WEIGHTS
    if not path.is_file():
        return set()
    names = set()
    for key in read_header(path).tensors:
        for marker in (".lora_A", ".lora_B", ".lora_embedding_A", ".lora_embedding_B", ".lora_magnitude_vector"):
            if marker in key:
                names.add(key.split(marker)[0].rsplit(".", 1)[-1])
                break
        else:  # a full tensor beside the LoRA pairs: a modules_to_save copy
            names.add(key.rsplit(".", 2)[-2] if key.count(".") >= 2 else key)
    return names


def _targets(config: dict[str, Any]) -> set[str]:
    targets = config.get("target_modules")
    if isinstance(targets, list):
        return {str(t).rsplit(".", 1)[-1] for t in targets}
    return set()  # a regex string: the weights say what it matched


def vllm_lora_problems(adapter: Path, config: dict[str, Any]) -> list[str]:
    """Each vLLM LoRA rule the adapter breaks, one line naming the rule (empty: vLLM takes it)."""
    out = []
    ranks = {int(config.get("r") or 0), *(int(v) for v in (config.get("rank_pattern") or {}).values())}
    bad = sorted(r for r in ranks if r not in VLLM_LORA_RANKS)
    if bad:
        out.append(f"LoRA rank {bad[0]} is not one vLLM accepts (--max-lora-rank takes "
                   f"{', '.join(map(str, VLLM_LORA_RANKS))}): retrain with --lora-rank "
                   f"{min((r for r in VLLM_LORA_RANKS if r >= bad[0]), default=512)}, or serve with --engine transformers")
    if config.get("modules_to_save"):
        out.append(f"modules_to_save is set ({', '.join(map(str, config['modules_to_save']))}): vLLM serves no "
                   "fully trained modules beside an adapter; merge it (trnqwen merge) and serve the merged folder")
    if config.get("use_dora"):
        out.append("use_dora is set: vLLM serves no DoRA adapters; merge it (trnqwen merge) and serve the merged folder")
    unsupported = sorted((_targets(config) | adapter_modules(adapter)) - set(VLLM_LORA_MODULES))
    if unsupported:
        out.append(f"target module {unsupported[0]} is not one vLLM's LoRA supports ({', '.join(VLLM_LORA_MODULES)}): "
                   "retrain without it, or merge it (trnqwen merge) and serve the merged folder")
    return out


def max_lora_rank(config: dict[str, Any]) -> int:
    ranks = [int(config.get("r") or 0), *(int(v) for v in (config.get("rank_pattern") or {}).values())]
    return max(ranks)


# --- settings ------------------------------------------------------------------------------------


def default_engine(device_type: str) -> str:
    return "vllm" if device_type == "neuron" else "transformers"


def tensor_parallel(cores: int, heads: Optional[int]) -> int:
    """The cores one server spans: every logical core, or the largest count that divides the
    attention heads (vLLM refuses a tensor-parallel size that does not)."""
    cores = max(1, int(cores))
    if not heads:
        return cores
    return max(n for n in range(1, cores + 1) if heads % n == 0)


def adapter_name(adapter: Path) -> str:
    """The model name an adapter is served as: its run folder's name and step (``ft-step-2``)."""
    step = adapter.name
    owner = adapter.parent.parent.name if adapter.parent.name == "hf" else adapter.parent.name
    text = f"{owner}-{step}" if owner else step
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-") or "adapter"


def _engine_binary(engine: str) -> Optional[str]:
    """The engine's executable: beside this Python first (a venv), else on PATH."""
    import sys

    beside = Path(sys.executable).parent / engine
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(engine)


def plan_serve(arg: Optional[str], *, cfg: RunConfig, base: Optional[Path] = None, engine: Optional[str] = None,
               host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, device_type: Optional[str] = None,
               cores: Optional[int] = None, environ: Optional[dict[str, str]] = None) -> ServePlan:
    """The server for ``arg`` (see the module doc).  ``device_type``/``cores`` default to the
    probe's (no runtime initialised)."""
    from trnqwen.evaluate.targets import resolve_target

    environ = dict(os.environ) if environ is None else environ
    if engine is not None and engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}", hint=f"use one of: {', '.join(ENGINES)}")
    if not 0 < int(port) < 65536:
        raise UsageError(f"--port {port} is not a TCP port", hint="pass a port between 1 and 65535, e.g. --port 8000")
    if engine != "transformers" and (device_type is None or cores is None):
        from trnqwen.env.device import detect_device

        device = detect_device("auto")
        device_type = device_type or device.type
        cores = cores if cores is not None else device.count
    engine = engine or default_engine(device_type or "cpu")
    target = resolve_target(arg, Path(cfg.runs_dir), base_dir=base, base_flag="--base")
    if engine == "vllm":
        return _vllm_plan(target, cfg=cfg, host=host, port=port, device_type=device_type or "cpu", cores=cores or 1,
                          environ=environ)
    return _transformers_plan(target, cfg=cfg, host=host, port=port)


def has_chat_template(folder: Path) -> bool:
    """Whether the tokenizer in ``folder`` carries a chat template (chat_template.jinja, or
    tokenizer_config.json's chat_template): /v1/chat/completions needs one."""
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(config.get("chat_template"))


def _template_note(target: EvalTarget) -> list[str]:
    folder = target.tokenizer_dir
    if has_chat_template(folder):
        return []
    return [f"warning: {folder} has no chat template, so /v1/chat/completions fails; /v1/completions works "
            "(train with --chat-template chatml, or add chat_template.jinja to the export)"]


def _model_config(target: EvalTarget) -> dict[str, Any]:
    try:
        return target.config
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {target.config_dir / 'config.json'}: {exc}") from None


def _vllm_plan(target: EvalTarget, *, cfg: RunConfig, host: str, port: int, device_type: str, cores: int,
               environ: dict[str, str]) -> ServePlan:
    from trnqwen.contract.peft_adapter import read_adapter_config

    config = _model_config(target)
    notes = _template_note(target)
    heads = config.get("num_attention_heads")
    tp = tensor_parallel(cores, heads if isinstance(heads, int) else None)
    where = f"{cores} logical NeuronCores" if device_type == "neuron" else f"{cores} {device_type} device(s)"
    notes.append(f"tensor parallel {tp}: {where}" + (f", capped to divide {heads} attention heads" if tp != cores else "")
                 + ("" if device_type == "neuron" else "; no Neuron device here: run it on the Trainium host, where "
                    "it spans the logical NeuronCores (64 on a trn2.48xlarge)"))
    seq_len = target.run.seq_len if target.run is not None else None
    if seq_len:
        max_len, why = seq_len, f"the run's seq_len ({target.run.run_id})"
    else:
        max_len = config.get("max_position_embeddings")
        why = "config.json's max_position_embeddings"
    argv = [_engine_binary("vllm") or "vllm", "serve", str(target.folder), "--host", host, "--port", str(port),
            "--tensor-parallel-size", str(tp)]
    if isinstance(max_len, int):
        argv += ["--max-model-len", str(max_len)]
        notes.append(f"max model len {max_len}: {why}")
    model = str(target.folder)
    kind = "model"
    if target.adapter is not None:
        kind = "adapter"
        adapter_config = read_adapter_config(target.adapter)
        problems = vllm_lora_problems(target.adapter, adapter_config)
        if problems:
            exc = CheckFailed(f"vLLM cannot serve the adapter {target.adapter}: {problems[0]}")
            if len(problems) > 1:
                exc.problems = [exc.message, *problems[1:]]
            raise exc
        model = adapter_name(target.adapter)
        argv += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(max_lora_rank(adapter_config)),
                 "--lora-modules", f"{model}={target.adapter}"]
        notes.append(f"the adapter is served as model {model!r} on its base {target.folder} (ask for the base by its path)")
    env = {}
    if device_type == "neuron" or VLLM_CACHE_VAR not in environ:
        if VLLM_CACHE_VAR in environ:
            notes.append(f"compile cache: {VLLM_CACHE_VAR}={environ[VLLM_CACHE_VAR]} (yours)")
        else:
            cache = (Path(cfg.compile_cache_dir or DEFAULT_COMPILE_CACHE).expanduser().absolute()) / "vllm"
            env[VLLM_CACHE_VAR] = str(cache)
            notes.append(f"compile cache: {cache} (NEFFs under neuron/compile_cache; compile_cache_dir in trnqwen.toml moves it)")
    return ServePlan(engine="vllm", argv=argv, env=env, host=host, port=int(port), model=model, served=target.folder,
                     kind=kind, adapter=target.adapter, base=target.folder if target.adapter else None,
                     tensor_parallel=tp, max_model_len=max_len if isinstance(max_len, int) else None, notes=notes)


def _transformers_plan(target: EvalTarget, *, cfg: RunConfig, host: str, port: int) -> ServePlan:
    from trnqwen.ckpt.merge import merged_path

    notes = _template_note(target)
    merge_needed = False
    kind = "model"
    served = target.folder
    config = _model_config(target)
    if not config.get("architectures"):  # transformers serve picks the model class from it (a TypeError without)
        raise UsageError(f"{target.config_dir / 'config.json'} names no architectures: transformers serve cannot "
                         "pick a model class", hint='add "architectures": ["Qwen3ForCausalLM"] to it (the base snapshot has it)')
    if target.adapter is not None:
        kind = "adapter"
        served = merged_path(target.adapter)
        if (served / "config.json").is_file():
            notes.append(f"the adapter is served merged into its base: {served} (already merged)")
        else:
            merge_needed = True
            notes.append(f"the adapter is served merged into its base: written to {served} first (trnqwen merge)")
    elif target.config_dir != target.folder:
        raise UsageError(f"{target.folder} holds weights only (its config.json is in {target.config_dir})",
                         hint="serve the export a finished run wrote (hf/step-N: config, tokenizer and weights)")
    argv = [_engine_binary("transformers") or "transformers", "serve", str(served), "--host", host, "--port", str(port),
            "--device", "auto", "--log-level", "info"]
    if cfg.trust_remote_code:
        argv.append("--trust-remote-code")
    return ServePlan(engine="transformers", argv=argv, env={}, host=host, port=int(port), model=str(served),
                     served=served, kind=kind, adapter=target.adapter, base=target.folder if target.adapter else None,
                     merge_needed=merge_needed, notes=notes)


def check_installed(plan: ServePlan) -> None:
    """EnvironmentProblem (exit 3) when the engine cannot start here."""
    if plan.engine == "vllm":
        if _engine_binary("vllm") is None:
            raise EnvironmentProblem("vllm is not installed here (no `vllm` command)", hint=VLLM_INSTALL_HINT)
        return
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
    if missing or _engine_binary("transformers") is None:
        what = ", ".join(missing) if missing else "the `transformers` command"
        raise EnvironmentProblem(f"transformers serve needs {what}, not installed here", hint=TRANSFORMERS_INSTALL_HINT)


__all__ = ["ENGINES", "ServePlan", "VLLM_LORA_MODULES", "VLLM_LORA_RANKS", "adapter_modules", "check_installed",
           "default_engine", "max_lora_rank", "plan_serve", "tensor_parallel", "vllm_lora_problems"]
