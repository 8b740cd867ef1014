"""What a standard HF Qwen3 checkpoint must contain, derived from its config.json.

Two ways to get the expected tensors, with the same answer:

* :func:`expected_tensors` (default, no torch): the parameter names and shapes of
  ``Qwen3ForCausalLM`` / the Hub layout of ``Qwen3MoeForCausalLM`` computed from the config's
  fields (transformers' defaults fill absent keys).  Importing torch + transformers costs
  2.5-5 s, more than verifying a whole 8 GB checkpoint, so the fast path never does.
* :func:`round_trip` (``--round-trip``): the recipe's check for real.  Builds
  ``AutoModelForCausalLM.from_config`` on the meta device and calls
  ``load_state_dict(strict=False, assign=True)`` with meta tensors shaped like the file headers:
  torch's own key matching, no tensor memory at all.

Why keys-vs-headers equals the recipe's ``load_state_dict(strict=False)``: with ``strict=False``
load_state_dict reports ``missing_keys`` = model.state_dict() keys absent from the input and
``unexpected_keys`` = input keys the model does not have, and raises on a shape mismatch.  Set
differences between the model's state-dict (names, shapes) and the headers give exactly those
lists without touching tensor data.  Tests check all three (analytic, meta round trip, and a real
load of real tensors) agree on good and broken tiny checkpoints, and that the analytic spec equals
the meta model's state_dict over many generated configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trnqwen.assets import moe_layout
from trnqwen.safetensors_format import TORCH_TO_ST
from trnqwen.errors import UsageError

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")
TIED_KEY = "lm_head.weight"

# transformers 5 class defaults for the fields the parameter shapes depend on.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, head_dim=128, attention_bias=False,
        tie_word_embeddings=False,
    ),
    "qwen3_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=4, head_dim=None, attention_bias=False,
        tie_word_embeddings=False,  # the MoE fields' defaults: trnqwen.assets.moe_layout
    ),
}


@dataclass(frozen=True)
class ExpectedTensor:
    shape: tuple[int, ...]
    dtype: Optional[str]  # safetensors dtype name the config asks for (None: config names none)


@dataclass
class ModelSpec:
    model_type: str
    tied: bool
    dtype: Optional[str]
    num_layers: int
    hidden_size: int
    vocab_size: int
    tensors: dict[str, ExpectedTensor]

    @property
    def expected_missing(self) -> list[str]:
        """Keys a correct export may leave out: the tied output head."""
        return [TIED_KEY] if self.tied and TIED_KEY in self.tensors else []

    @property
    def num_parameters(self) -> int:
        """Parameters of the model (a tied head counted once)."""
        import math

        return sum(math.prod(t.shape) for k, t in self.tensors.items() if not (self.tied and k == TIED_KEY))

    def describe(self) -> str:
        return (
            f"{self.model_type}, {self.num_layers} layers, hidden {self.hidden_size}, vocab {self.vocab_size}"
            f", {'tied' if self.tied else 'untied'} embeddings" + (f", {self.dtype}" if self.dtype else "")
        )


def config_dtype(config: dict[str, Any]) -> Optional[str]:
    """The dtype config.json asks for (``dtype`` in transformers 5, ``torch_dtype`` before)."""
    value = config.get("dtype") or config.get("torch_dtype")
    if isinstance(value, str):
        return TORCH_TO_ST.get(value.removeprefix("torch."))
    return None


def check_model_type(config: dict[str, Any], where: str) -> str:
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = ", ".join(config.get("architectures") or []) or "no architectures"
        raise UsageError(
            f"{where} describes model_type {model_type!r} ({arch}), not a Qwen3 model",
            hint="verify-ckpt checks Qwen3 checkpoints; pass --assets with the Qwen3 snapshot the checkpoint was trained from",
        )
    return model_type


def expected_tensors(config: dict[str, Any], where: str = "config.json") -> ModelSpec:
    """Names, shapes and dtypes of the model's state dict, as ``AutoModelForCausalLM`` builds it."""
    model_type = check_model_type(config, where)
    layout = moe_layout(config, where)  # every MoE key form, one reader (None: dense Qwen3)
    # Absent keys take the class default; an explicit null takes the derived value (kv heads =
    # heads, head_dim = hidden // heads), as the config's __post_init__/the attention module do.
    c = {**_DEFAULTS[model_type], **{k: v for k, v in config.items() if k in _DEFAULTS[model_type]}}
    try:
        c.update({k: _DEFAULTS[model_type][k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads") if c[k] is None})
        vocab, hidden, inter = int(c["vocab_size"]), int(c["hidden_size"]), int(c["intermediate_size"])
        layers, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
        kv = int(c["num_key_value_heads"] or heads)
        head_dim = int(c["head_dim"] or hidden // heads)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: a size field is not a number ({exc})") from None
    dtype = config_dtype(config)
    bias = bool(c["attention_bias"])

    def t(*shape: int) -> ExpectedTensor:
        return ExpectedTensor(tuple(shape), dtype)

    out: dict[str, ExpectedTensor] = {"model.embed_tokens.weight": t(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = t(heads * head_dim, hidden)
        if bias:
            out[p + "self_attn.q_proj.bias"] = t(heads * head_dim)
        out[p + "self_attn.k_proj.weight"] = t(kv * head_dim, hidden)
        if bias:
            out[p + "self_attn.k_proj.bias"] = t(kv * head_dim)
        out[p + "self_attn.v_proj.weight"] = t(kv * head_dim, hidden)
        if bias:
            out[p + "self_attn.v_proj.bias"] = t(kv * head_dim)
        out[p + "self_attn.o_proj.weight"] = t(hidden, heads * head_dim)
        if bias:
            out[p + "self_attn.o_proj.bias"] = t(hidden)
        out[p + "self_attn.q_norm.weight"] = t(head_dim)
        out[p + "self_attn.k_norm.weight"] = t(head_dim)
        if layout is not None and i in layout.sparse_layers:
            # The Hub layout (one module per expert); transformers 5 fuses experts on load.
            experts, moe_inter = layout.num_experts, layout.moe_ffn_dim
            out[p + "mlp.gate.weight"] = t(experts, hidden)
            for e in range(experts):
                q = f"{p}mlp.experts.{e}."
                out[q + "gate_proj.weight"] = t(moe_inter, hidden)
                out[q + "up_proj.weight"] = t(moe_inter, hidden)
                out[q + "down_proj.weight"] = t(hidden, moe_inter)
        else:
            out[p + "mlp.gate_proj.weight"] = t(inter, hidden)
            out[p + "mlp.up_proj.weight"] = t(inter, hidden)
            out[p + "mlp.down_proj.weight"] = t(hidden, inter)
        out[p + "input_layernorm.weight"] = t(hidden)
        out[p + "post_attention_layernorm.weight"] = t(hidden)
    out["model.norm.weight"] = t(hidden)
    out[TIED_KEY] = t(vocab, hidden)
    return ModelSpec(model_type, bool(c["tie_word_embeddings"]), dtype, layers, hidden, vocab, out)


# --- the recipe's round trip, for real -------------------------------------------------------


@dataclass
class RoundTripResult:
    missing_keys: list[str]
    unexpected_keys: list[str]
    model_class: str
    tied: bool


def round_trip(config_dir: str, header_tensors: dict[str, tuple[tuple[int, ...], str]], *, trust_remote_code: bool = False) -> RoundTripResult:
    """``AutoModelForCausalLM`` on meta + ``load_state_dict(strict=False, assign=True)``.

    ``header_tensors`` maps each checkpoint tensor to (shape, safetensors dtype).  Tensors whose
    shape disagrees with the model are left out of the call (torch would raise on them even with
    strict=False; they are reported as shape mismatches instead), so they show up here as missing.
    Nothing is allocated: every tensor lives on the meta device.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trnqwen.safetensors_format import DTYPES

    config = AutoConfig.from_pretrained(config_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    own = model.state_dict()
    state = {}
    for name, (shape, st_dtype) in header_tensors.items():
        if name in own and tuple(own[name].shape) != tuple(shape):
            continue
        dtype = getattr(torch, DTYPES[st_dtype].torch_name)
        state[name] = torch.empty(shape, dtype=dtype, device="meta")
    result = model.load_state_dict(state, strict=False, assign=True)
    return RoundTripResult(
        sorted(result.missing_keys),
        sorted(result.unexpected_keys),
        type(model).__name__,
        bool(getattr(config, "tie_word_embeddings", False)),
    )


def round_trip_pretrained(folder: str, config: dict[str, Any], *, trust_remote_code: bool = False) -> dict[str, Any]:
    """A Qwen3-MoE export through transformers' own ``from_pretrained`` of the folder, on the meta
    device (no tensor data read): its weight conversion fuses the per-expert Hub tensors into
    ``mlp.experts.gate_up_proj``/``down_proj`` as it does for a real load.  Then the loaded model's
    experts and router are checked against config.json (:func:`trnqwen.assets.moe_layout`).

    Returns {model_class, missing_keys, unexpected_keys, mismatched_keys, problems, error}:
    ``error`` is transformers' own refusal (a conversion that cannot concatenate the experts, e.g.
    an expert missing), ``problems`` what the expert/router check found."""
    import contextlib
    import io
    import logging

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    layout = moe_layout(config)
    out: dict[str, Any] = {"model_class": "AutoModelForCausalLM", "missing_keys": [], "unexpected_keys": [],
                           "mismatched_keys": [], "problems": [], "error": None}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, device_map="meta", dtype="auto", output_loading_info=True, trust_remote_code=trust_remote_code,
                use_safetensors=True,  # a pickle beside the shards is never read
            )
    except (RuntimeError, ValueError, OSError, KeyError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = [line for line in sink.getvalue().splitlines() if line.startswith(("Error:", "RuntimeError:"))]
        out["error"] = "; ".join(dict.fromkeys(detail[-2:] + lines[:1]))[:400] or type(exc).__name__
        return out
    finally:
        hf_logging.set_verbosity(level)
    out["model_class"] = type(model).__name__
    out["missing_keys"] = sorted(info.get("missing_keys") or [])
    out["unexpected_keys"] = sorted(info.get("unexpected_keys") or [])
    out["mismatched_keys"] = sorted(str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys") or [])
    if layout is None:
        return out
    params = dict(model.named_parameters())
    hidden = int(config["hidden_size"])
    want = {
        "mlp.experts.gate_up_proj": (layout.num_experts, 2 * layout.moe_ffn_dim, hidden),
        "mlp.experts.down_proj": (layout.num_experts, hidden, layout.moe_ffn_dim),
        "mlp.gate.weight": (layout.num_experts, hidden),
    }
    for i in range(layout.n_layers):
        sparse = i in layout.sparse_layers
        for suffix, shape in want.items():
            name = f"model.layers.{i}.{suffix}"
            got = tuple(params[name].shape) if name in params else None
            if sparse and got != shape:
                out["problems"].append(f"{name}: {got or 'absent'} after loading, config.json says {shape}")
            if not sparse and got is not None:
                out["problems"].append(f"{name}: layer {i} is dense in config.json but loaded experts")
    experts = {type(m).__name__: int(getattr(m, "num_experts", 0)) for n, m in model.named_modules() if n.endswith("mlp.experts")}
    if any(n != layout.num_experts for n in experts.values()):
        out["problems"].append(f"experts per layer {sorted(set(experts.values()))}, config.json says {layout.num_experts}")
    top_k = {int(getattr(m, "top_k", 0)) for n, m in model.named_modules() if n.endswith("mlp.gate")}
    if layout.is_moe and top_k != {layout.top_k}:
        out["problems"].append(f"router top-k {sorted(top_k)}, config.json says {layout.top_k}")
    out["checked"] = f"{len(layout.sparse_layers)} MoE layer(s) x {layout.num_experts} experts, top-{layout.top_k}"
    return out
