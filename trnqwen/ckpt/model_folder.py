"""Make an export a whole model folder: what ``from_pretrained``, ``hf upload``, vLLM and TGI read.

torchtitan (and the hf-trainer backend, which copies its layout) writes only the safetensors and
their index into ``step-N/``.  After a successful run the launcher completes the folder the way
every peer does:

  config.json              the base model's, with ``dtype`` set to the dtype the weights were saved in
  generation_config.json   the base model's (or one derived from config.json)
  tokenizer files          copied from the base snapshot, the chat template included (the run's
                           --chat-template instead, when it trained with one)
  README.md                a short model card with Hub metadata (``base_model``, ``tags``) naming
                           the base model, dataset, steps, backend, final and validation loss

Every file is written atomically and only if absent or ours (a file the user put there is kept).
Pure Python + huggingface_hub's ModelCard: the launcher never imports torch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import ADAPTER_CONFIG, TOKENIZER_FILES
from trnqwen.fsutil import current_umask, write_text_atomic
from trnqwen.rundir import RunRecord
from trnqwen.methods import registry

CARD = "README.md"
SHARDS = "sharded"
CARD_MARKER = "<!-- written by trnqwen -->"
HARNESS_RECORD = "eval-harness.json"  # trnqwen eval --tasks' results in a run dir (trnqwen.evaluate.harness)


def benchmark_rows(path: Path) -> list[dict[str, Any]]:
    """The card's benchmark rows from an ``eval --tasks`` record: per task, the base's score and the
    tuned model's (the first tuned model the record names), and the difference."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    results = record.get("results") or []
    base = next((r for r in results if r.get("is_base")), None)
    tuned = next((r for r in results if not r.get("is_base")), None)
    if tuned is None:
        return []
    rows = []
    for task, score in (tuned.get("scores") or {}).items():
        before = ((base or {}).get("scores") or {}).get(task) or {}
        rows.append({"task": task, "metric": score.get("metric"), "tuned": score.get("value"),
                     "stderr": score.get("stderr"), "base": before.get("value"),
                     "delta": (tuned.get("delta_vs_base") or {}).get(task), "limit": record.get("limit")})
    return rows


@dataclass
class CardInfo:
    """What the model card says about the run that produced the weights."""

    base_model: str  # the Hub repo id, or a local name for builtin/local models
    backend: str  # "" when unknown (a merge of an adapter whose run is not found)
    steps: Optional[int] = None
    dataset: Optional[str] = None
    final_loss: Optional[float] = None
    validation_loss: Optional[float] = None
    validation_step: Optional[int] = None  # the step it was measured after (not always the last step)
    eval_results: list[dict[str, Any]] = field(default_factory=list)  # trnqwen eval's rows
    eval_dataset: Optional[str] = None
    run_id: Optional[str] = None
    trnqwen_version: Optional[str] = None
    adapter: Optional[dict[str, Any]] = None  # a LoRA run's adapter_config.json: the card describes an adapter
    method: Optional[str] = None  # the training method (trnqwen.methods.registry); None: the default
    merged_adapter: Optional[dict[str, Any]] = None  # a merged model: the adapter_config.json merged in
    benchmarks: list[dict[str, Any]] = field(default_factory=list)  # eval --tasks' rows (the run dir's record)


def card_info(record: RunRecord, eval_results: Optional[list[dict[str, Any]]] = None, eval_dataset: Optional[str] = None) -> CardInfo:
    """What the card says about a run, from its record (:class:`trnqwen.rundir.RunRecord`):
    base model, dataset, steps, backend, the last logged loss, the last validation loss."""
    from trnqwen import __version__

    config = record.config or {}
    model = str(record.extra.get("base_model") or config.get("model") or "")  # the base the run recorded
    last = (record.extra.get("summary") or {}).get("last_step") or {}
    validation = last_validation(Path(record.log_path)) if record.log_path else None
    return CardInfo(
        base_model=model.split(":", 1)[1] if model.startswith("builtin:") else model,
        backend=str(record.backend or config.get("backend") or ""),
        steps=last.get("step") or record.steps,
        dataset=config.get("dataset"),
        final_loss=last.get("loss"),
        validation_loss=validation.get("loss") if validation else None,
        validation_step=validation.get("step") if validation else None,
        eval_results=list(eval_results or []),
        eval_dataset=eval_dataset,
        run_id=record.run_id,
        trnqwen_version=__version__,
        method=config.get("method"),
        benchmarks=benchmark_rows(Path(record.run_dir) / HARNESS_RECORD) if record.run_dir else [],
    )


def complete_run_export(record: RunRecord, exported: Path) -> list[str]:
    """:func:`complete_export` for a finished run, from its record (assets, config, summary, log)."""
    config = record.config or {}
    overrides = None
    if config.get("backend") == "nki-moe":  # the recipe cuts the model: the export is the cut one
        overrides = {"num_hidden_layers": config.get("moe_layers"), "num_experts": config.get("num_experts"),
                     "num_experts_per_tok": config.get("top_k")}
    written = complete_export(exported, Path(record.assets_dir), card_info(record), config_overrides=overrides)
    return written + _trained_template(record, exported)


def _trained_template(record: RunRecord, exported: Path) -> list[str]:
    """A run trained with ``--chat-template``: that template into the export's tokenizer files, so the
    served model is prompted as it was trained (the token cache keeps the text it rendered with)."""
    from trnqwen.dataset.cache import read_meta
    from trnqwen.dataset.template import export_template, resolve_template

    text = None
    cache = record.extra.get("dataset_cache")
    if cache:
        try:
            text = read_meta(Path(cache)).get("chat_template")
        except (OSError, ValueError):
            text = None
    if text is None and (record.config or {}).get("chat_template"):
        text = resolve_template(record.config["chat_template"]).text
    return export_template(exported, text) if text else []


def last_validation(log_path: Path) -> Optional[dict[str, Any]]:
    """The last ``validate step:`` line of a run's log (torchtitan's validator): {"step", "loss", ...}."""
    from trnqwen.contract.stepline import parse_validation_line

    found = None
    try:
        with open(log_path, "rb") as fh:
            for raw in fh:
                if b"validate step:" in raw:
                    parsed = parse_validation_line(raw.decode("utf-8", "replace"))
                    if parsed and parsed.get("loss") is not None:
                        found = parsed
    except OSError:
        return None
    return found


def weights_dtype(folder: Path) -> Optional[str]:
    """The torch dtype name of the first floating tensor in the folder's safetensors."""
    from trnqwen.safetensors_format import DTYPES, read_header

    for path in sorted(Path(folder).glob("*.safetensors")):
        for info in read_header(path).tensors.values():
            dtype = DTYPES.get(info.dtype)
            if dtype is not None and dtype.is_float:
                return dtype.torch_name
    return None


def complete_export(folder: Path, assets: Path, info: CardInfo, *, config_overrides: Optional[dict[str, Any]] = None) -> list[str]:
    """Write config, generation config, tokenizer and model card into ``folder``; return the names
    written.  ``config_overrides``: config.json fields the training changed (nki-moe's cut)."""
    folder, assets = Path(folder), Path(assets)
    written: list[str] = []
    if (folder / ADAPTER_CONFIG).is_file():  # a PEFT adapter: tokenizer and card; no config.json (not a model)
        info.adapter = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        written += _copy_tokenizer(folder, assets)
        if write_model_card(folder, info):
            written.append(CARD)
        return written
    config = json.loads((assets / "config.json").read_text(encoding="utf-8"))
    config.update({k: v for k, v in (config_overrides or {}).items() if v is not None})
    dtype = weights_dtype(folder)
    if dtype:
        config["dtype"] = dtype
        if "torch_dtype" in config:  # older readers (vLLM, TGI on transformers 4.x) look here
            config["torch_dtype"] = dtype
    if _write_if_ours(folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n"):
        written.append("config.json")
    generation = assets / "generation_config.json"
    text = generation.read_text(encoding="utf-8") if generation.is_file() else json.dumps(_generation_from(config), indent=2) + "\n"
    if _write_if_ours(folder / "generation_config.json", text):
        written.append("generation_config.json")
    written += _copy_tokenizer(folder, assets)
    if write_model_card(folder, info):
        written.append(CARD)
    moved = move_shards_out(folder)
    if moved is not None:
        written.append(f"{SHARDS}/ -> {moved}")
    return written


def _copy_tokenizer(folder: Path, assets: Path) -> list[str]:
    written = []
    for name in TOKENIZER_FILES:
        source = assets / name
        if source.is_file() and not (folder / name).exists():
            _copy_atomic(source, folder / name)
            written.append(name)
    return written


def move_shards_out(folder: Path) -> Optional[Path]:
    """torchtitan leaves the per-rank pieces it consolidated from in ``<export>/sharded/``: a second
    copy of every weight that `hf upload` or a serving engine would pick up.  They go beside the
    export (``<export>.sharded/``, which step scans ignore and ``--overwrite`` clears with the rest)."""
    shards = Path(folder) / SHARDS
    if not shards.is_dir():
        return None
    # Claim the folder by renaming it first: of two processes completing one export (two nodes on a
    # shared disk), exactly one moves it, and only that one replaces a stale copy beside it.
    claimed = Path(folder) / f".{SHARDS}.{os.getpid()}.{threading.get_ident()}"
    try:
        os.replace(shards, claimed)
    except FileNotFoundError:  # the other process moved it
        return None
    dest = Path(folder).with_name(f"{Path(folder).name}.{SHARDS}")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(claimed, dest)
    return dest


def write_model_card(folder: Path, info: CardInfo) -> bool:
    """README.md with Hub model-card metadata; replaces only a card trnqwen wrote."""
    return _write_if_ours(Path(folder) / CARD, render_card(info), card=True)


def render_card(info: CardInfo) -> str:
    from huggingface_hub import ModelCard, ModelCardData

    hub_id = info.base_model if _looks_like_hub_id(info.base_model) else None
    trainer = "transformers-trainer" if info.backend == "hf-trainer" else "torchtitan"
    adapter = info.adapter
    data = ModelCardData(
        base_model=hub_id,
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        tags=["trnqwen", trainer, *([f"trnqwen-{info.backend}"] if info.backend else []), "qwen3", "fine-tuned",
              *(["lora", "peft"] if adapter else []), *(["lora", "merged"] if info.merged_adapter else [])],
        datasets=[info.dataset] if info.dataset and _looks_like_hub_id(info.dataset) else None,
    )
    merged = info.merged_adapter
    rows = [
        ("base model", info.base_model),
        # a run without --dataset trained on the model's default corpus; no run known: nothing to say
        ("dataset", info.dataset or ("(the model's default)" if info.run_id else None)),
        ("method", info.method),
        ("steps", info.steps),
        ("backend", f"{info.backend} ({trainer})" if info.backend else None),
        ("adapter", _describe_adapter(adapter) if adapter else None),
        ("merged", f"base + {_describe_adapter(merged)} (trnqwen merge)" if merged else None),
        ("final training loss", _num(info.final_loss)),
        ("validation loss", _num(info.validation_loss) + (f" (after step {info.validation_step})" if info.validation_step else "")
         if info.validation_loss is not None else None),
        ("run", info.run_id),
        ("trnqwen", info.trnqwen_version),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows if v is not None)
    body = [
        f"# {Path(info.base_model).name} {'LoRA adapter' if adapter else 'fine-tuned'} with trnqwen",
        "",
        CARD_MARKER,
        f"Fine-tuned from `{info.base_model}` with trnqwen" + (f" on the {info.backend} backend." if info.backend else "."),
        "",
        "| | |",
        "|---|---|",
        table,
    ]
    section = registry.hook(registry.find(info.method) or registry.get(None), "card") if info.eval_results else None
    if section is not None:  # the training method's own section (trnqwen/methods/<name>/card.py)
        body += section(info.eval_results, info.eval_dataset, _num)
    elif info.eval_results:
        on = f" on {info.eval_dataset}" if info.eval_dataset else ""
        body += ["", f"## Held-out evaluation (`trnqwen eval`{on})", "", "| checkpoint | tokens | loss | perplexity | vs base |",
                 "|---|---|---|---|---|"]
        for r in info.eval_results:
            delta = r.get("delta_vs_base")
            body.append(
                f"| {r.get('checkpoint')} | {r.get('tokens')} | {_num(r.get('loss'))} | {_num(r.get('perplexity'))} | "
                f"{'' if delta is None else f'{delta:+.4f}'} |"
            )
    if info.benchmarks:
        limit = info.benchmarks[0].get("limit")
        body += ["", "## Benchmarks (lm-evaluation-harness, `trnqwen eval --tasks`"
                 + (f", limit {limit:g}" if isinstance(limit, (int, float)) else "") + ")", "",
                 "| task | metric | base | this model | vs base |", "|---|---|---|---|---|"]
        for r in info.benchmarks:
            delta = r.get("delta")
            body.append(f"| {r['task']} | {r.get('metric')} | {_num(r.get('base'))} | {_num(r.get('tuned'))} | "
                        f"{'' if delta is None else f'{delta:+.4f}'} |")
    if adapter:
        body += ["", f"A PEFT LoRA adapter for `{info.base_model}`: load it with "
                 "`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), path)`, or merge it with "
                 "`trnqwen merge path`; the tokenizer carries the chat template.", ""]
    else:
        body += ["", "Load it with `AutoModelForCausalLM.from_pretrained(path)`; the tokenizer carries the chat template.", ""]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body)))


def _describe_adapter(config: dict[str, Any]) -> str:
    targets = config.get("target_modules") or []
    targets = targets if isinstance(targets, str) else ",".join(sorted(targets))
    rslora = ", rsLoRA" if config.get("use_rslora") else ""
    return f"LoRA r {config.get('r')}, alpha {config.get('lora_alpha')}{rslora}, targets {targets}"


def _num(value: Any) -> Optional[str]:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.4f}" if math.isfinite(number) else str(number)


def _looks_like_hub_id(name: str) -> bool:
    import re

    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", name)) and not Path(name).expanduser().exists()


def _generation_from(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}


def _write_if_ours(path: Path, text: str, *, card: bool = False) -> bool:
    """Write unless a file is there that trnqwen did not write (the user's own card is kept)."""
    if path.exists():
        if not card:
            return False
        try:
            if CARD_MARKER not in path.read_text(encoding="utf-8"):
                return False
        except (OSError, UnicodeDecodeError):
            return False
    write_text_atomic(path, text)
    return True


def _copy_atomic(source: Path, dest: Path) -> None:
    """Copy via a temp name of its own (two writers never share one) and a rename."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        shutil.copyfile(source, tmp)
        tmp.chmod(0o666 & ~current_umask())
        tmp.replace(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
