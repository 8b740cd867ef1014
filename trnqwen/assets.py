"""Is this folder a model: the one place that reads a Hugging Face model folder's make-up.

A model folder (what ``trnqwen fetch`` writes, or any HF snapshot) holds ``config.json``,
tokenizer files and, for a fine-tune, safetensors weight shards (listed by
``model.safetensors.index.json`` when sharded).  The recipes read ``config.json`` from here,
preflight turns what is missing into findings (the one place asset problems are reported), and
fetch / verify-ckpt share the safetensors header reader (:mod:`trnqwen.safetensors_format`).

Plain file reads only: no torch, no transformers, no tensor data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trnqwen.constants import DEFAULT_MODEL
from trnqwen.fsutil import broken_link
from trnqwen.naming import model_name
from trnqwen.safetensors_format import SafetensorsFormatError, read_header

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
# A PEFT (LoRA) adapter folder: trnqwen.contract.peft_adapter writes and reads it.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Any one of these sets is a tokenizer torchtitan / transformers can load.
TOKENIZER_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))
# Every file that decides tokens or the chat template: hashed into the data cache key, copied
# into an export so it is a whole model folder.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
)


# trnqwen fetch's record in a model folder: the repo id it came from (``builtin:...`` for a
# built-in), the commit, every file's hash (trnqwen.fetch.verify writes it).
MANIFEST = Path(".cache") / "trnqwen" / "fetch.json"
# What the default model's config.json says (Qwen/Qwen3-4B-Instruct-2507 on the Hub): enough to
# tell another model's folder from it without the network.
DEFAULT_MODEL_SHAPE = {"model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "intermediate_size": 9728, "vocab_size": 151936}


def read_manifest(local_dir: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads((Path(local_dir) / MANIFEST).read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def base_identity(model: str, assets_dir: Optional[Path]) -> tuple[str, Optional[str]]:
    """(the model an export names as its base, a one-line note when that is not ``model``).

    ``model`` names the base unless ``assets_dir`` (``--assets``) holds another model: its fetch
    record names another repo (then that repo is the base), or its config.json differs from what
    ``model`` is known to be (the default model's shape, or ``model``'s own fetched folder), and
    then the folder itself is the base.  With nothing to compare against, ``model`` stands."""
    if assets_dir is None:
        return model, None
    folder = Path(assets_dir).expanduser()
    recorded = (read_manifest(folder) or {}).get("repo_id")
    if isinstance(recorded, str) and recorded:
        if recorded == model:
            return model, None
        return recorded, (f"--assets {folder} holds {recorded} (its fetch record), not --model {model}: "
                          f"the export names {recorded} as its base (pass --model {recorded} to say so)")
    config = read_config_json(folder)
    if config is None:
        return model, None  # preflight says what is missing
    own = Path("assets") / "hf" / model_name(model)
    reference: Optional[dict[str, Any]] = DEFAULT_MODEL_SHAPE if model == DEFAULT_MODEL else None
    if reference is None and own.absolute() != folder.absolute():
        reference = read_config_json(own)
    differ = [k for k in DEFAULT_MODEL_SHAPE if reference is not None and k in reference and config.get(k) != reference[k]]
    if not differ:
        return model, None
    name = str(folder.absolute())
    return name, (f"--assets {folder} is not {model} ({differ[0]} {config.get(differ[0])!r}, {model} has "
                  f"{reference[differ[0]]!r}): the export names the folder as its base (pass --model to name it)")


def read_config_json(folder: Path) -> Optional[dict[str, Any]]:
    """The folder's ``config.json`` as a dict; None when it is missing, unreadable or not a JSON object."""
    try:
        config = json.loads((Path(folder) / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


# transformers 5's Qwen3MoeConfig defaults for the mixture-of-experts fields (absent keys).
_MOE_DEFAULTS: dict[str, Any] = dict(
    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
    norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=None, router_aux_loss_coef=0.001,
    output_router_logits=False, num_hidden_layers=24,
)


@dataclass(frozen=True)
class MoeLayout:
    """The mixture-of-experts facts of a Qwen3-MoE ``config.json``, read once (:func:`moe_layout`).

    ``sparse_layers``: the layers whose MLP is routed experts, by transformers' own rule (layer
    ``i`` is sparse when ``i`` is not in ``mlp_only_layers``, there are experts, and
    ``(i + 1) % decoder_sparse_step == 0``); the others are dense MLPs of ``dense_ffn_dim``."""

    num_experts: int
    top_k: int
    moe_ffn_dim: int
    norm_topk_prob: bool
    n_layers: int
    sparse_layers: tuple[int, ...]
    dense_ffn_dim: int
    router_aux_loss_coef: float
    output_router_logits: bool

    @property
    def dense_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if i not in self.sparse_layers)

    @property
    def is_moe(self) -> bool:
        return bool(self.sparse_layers)

    @property
    def aux_loss_coef(self) -> float:
        """The weight of the router aux loss in transformers' training loss (0 unless the config
        sets ``output_router_logits``: Qwen3MoeForCausalLM only adds it then)."""
        return self.router_aux_loss_coef if self.output_router_logits else 0.0


def moe_layout(config: dict[str, Any], where: str = CONFIG_NAME) -> Optional[MoeLayout]:
    """The MoE layout of a ``qwen3_moe`` config in either key form (the Hub's ``num_experts``,
    transformers 5's ``num_local_experts``); None for any other model type.  A field that is
    not a number (or two expert counts that disagree) is a :class:`~trnqwen.errors.UsageError`."""
    from trnqwen.errors import UsageError

    if config.get("model_type") != "qwen3_moe":
        return None
    hub, local = config.get("num_experts"), config.get("num_local_experts")
    if hub is not None and local is not None and hub != local:
        raise UsageError(f"{where}: num_experts ({hub}) and num_local_experts ({local}) disagree",
                         hint="keep one of the two keys (transformers 5 writes num_local_experts)")
    c = {**_MOE_DEFAULTS, **{k: v for k, v in config.items() if k in _MOE_DEFAULTS and v is not None}}
    if local is not None:
        c["num_experts"] = local
    try:
        experts, step, n_layers = int(c["num_experts"]), int(c["decoder_sparse_step"]), int(c["num_hidden_layers"])
        mlp_only = {int(i) for i in (c["mlp_only_layers"] or [])}
        layout = MoeLayout(
            num_experts=experts, top_k=int(c["num_experts_per_tok"]), moe_ffn_dim=int(c["moe_intermediate_size"]),
            norm_topk_prob=bool(c["norm_topk_prob"]), n_layers=n_layers,
            sparse_layers=tuple(i for i in range(n_layers) if i not in mlp_only and experts > 0 and step > 0 and (i + 1) % step == 0),
            dense_ffn_dim=int(c["intermediate_size"]), router_aux_loss_coef=float(c["router_aux_loss_coef"]),
            output_router_logits=bool(c["output_router_logits"]),
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: a mixture-of-experts field is not a number ({exc})") from None
    if layout.is_moe and not 0 < layout.top_k <= layout.num_experts:
        raise UsageError(f"{where}: num_experts_per_tok {layout.top_k} is not between 1 and num_experts {experts}")
    return layout


def checkpoint_dtype(config: Optional[dict[str, Any]]) -> Optional[str]:
    """The torch dtype name a checkpoint's config.json names (``dtype``/``torch_dtype``): what every
    backend's HF export keeps; None when it names none of float16/bfloat16/float32."""
    if not config:
        return None
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "").removeprefix("torch.")
    return dtype if dtype in ("float16", "bfloat16", "float32") else None


# The model card tag of a snapshot whose weights are random by design (builtin:tiny-qwen3): a
# fine-tune of it starts at random-init loss, and inspect-logs says so instead of an error.
RANDOM_INIT_TAG = "random-init"
_CARD_NAME = "README.md"


def declares_random_init(folder: Path) -> bool:
    """Whether the model card (README.md front matter ``tags:``) of ``folder`` says its weights are
    random by design (:data:`RANDOM_INIT_TAG`)."""
    try:
        with open(Path(folder) / _CARD_NAME, encoding="utf-8", errors="replace") as fh:
            head = fh.read(8192)
    except OSError:
        return False
    if not head.startswith("---\n"):
        return False
    front = head[4:].split("\n---", 1)[0]
    tags: list[str] = []
    in_tags = False
    for line in front.splitlines():
        if line.startswith("tags:"):
            inline = line[5:].strip()
            tags += [t.strip(" '\"") for t in inline.strip("[]").split(",") if t.strip()] if inline else []
            in_tags = not inline
        elif in_tags and line.lstrip().startswith("- "):
            tags.append(line.lstrip()[2:].strip(" '\""))
        else:
            in_tags = False
    return RANDOM_INIT_TAG in tags


def has_tokenizer(folder: Path) -> bool:
    """Whether one complete tokenizer set is present (:data:`TOKENIZER_SETS`)."""
    return any(all((Path(folder) / name).is_file() for name in group) for group in TOKENIZER_SETS)


def index_weight_map(folder: Path) -> Optional[dict[str, str]]:
    """The index's tensor -> shard map; None without an index.  Raises ValueError when the index
    is there but not valid JSON (an incomplete download)."""
    index = Path(folder) / INDEX_NAME
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text()).get("weight_map", {})
    except (OSError, AttributeError) as exc:
        raise ValueError(str(exc)) from None
    return weight_map if isinstance(weight_map, dict) else {}


def missing_shards(folder: Path) -> list[str]:
    """Shard files the index names that are not in the folder (sorted); [] without an index."""
    weight_map = index_weight_map(folder) or {}
    return sorted({name for name in weight_map.values() if not (Path(folder) / name).is_file()})


def weight_shards(folder: Path) -> list[Path]:
    """The safetensors files a load reads: the ones the index names, else every ``*.safetensors``."""
    folder = Path(folder)
    weight_map = index_weight_map(folder)
    if weight_map is not None:
        return [folder / name for name in sorted(set(weight_map.values()))]
    return sorted(folder.glob("*.safetensors"))


def header_problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a readable, complete safetensors file (None when it is)."""
    link = broken_link(path)
    if link:
        return link
    try:
        read_header(path, known_dtypes=False)
    except SafetensorsFormatError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class AssetProblem:
    """One thing that stops a run from loading the folder; ``alternative`` is another way out
    besides fetching the model again (appended to the caller's fix)."""

    message: str
    alternative: str = ""


def folder_problems(folder: Path, *, weights: bool) -> list[AssetProblem]:
    """Everything that stops training from loading ``folder``: not a folder, ``config.json``
    missing or broken, no tokenizer set, and (``weights``: a fine-tune) shards missing, absent or
    unreadable.  Preflight and check-env both report these, each with the ``fetch`` command."""
    folder = Path(folder)
    if not folder.is_dir():
        link = broken_link(folder)
        what = f"{folder} is {link}" if link else f"{folder} is not a folder"
        return [AssetProblem(f"model assets not found: {what}")]
    problems = []
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        problems.append(AssetProblem(f"{config_path} is missing"))
    elif read_config_json(folder) is None:
        problems.append(AssetProblem(f"{config_path} is not valid JSON (incomplete download?)"))
    if not has_tokenizer(folder):
        problems.append(AssetProblem(f"no tokenizer files in {folder} (need tokenizer.json, or vocab.json + merges.txt)"))
    if weights:
        problems += _weight_problems(folder)
    return problems


def _weight_problems(folder: Path) -> list[AssetProblem]:
    try:
        missing = missing_shards(folder)
    except ValueError:
        return [AssetProblem(f"{folder / INDEX_NAME} is not valid JSON (incomplete download?)")]
    if missing:
        return [
            AssetProblem(
                f"--finetune needs every weight shard; missing in {folder}: {', '.join(missing[:4])}"
                + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
            )
        ]
    shards = weight_shards(folder)
    if not shards:
        return [
            AssetProblem(
                f"--finetune loads the published weights, but {folder} has no *.safetensors",
                alternative=", or drop --finetune to train from random init",
            )
        ]
    out = []
    for shard in shards:
        link = broken_link(shard)
        if link:
            out.append(AssetProblem(f"{shard} is {link}, not a safetensors file"))
        elif header_problem(shard) is not None:
            out.append(AssetProblem(f"{shard} is truncated or not a safetensors file"))
    return out
