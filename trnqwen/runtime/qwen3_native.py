"""torchtitan-native Qwen3 model specs for sizes torchtitan has no registered flavor for.

Generated config modules call :func:`qwen3_model_spec` with the numbers read from the
checkpoint's ``config.json``; it builds the model config with the same layer builders and
initialisers torchtitan uses for its registered Qwen3 flavors, so the state-dict adapter (HF
checkpoint keys) and sharding work unchanged.

Qwen3-MoE (``num_experts`` set): the sparse layers come from torchtitan's own
``_build_qwen3_moe_layers`` (GroupedExperts + TokenChoiceTopKRouter, softmax scores), the
dense layers of a mix (``mlp_only_layers``, ``decoder_sparse_step``) from ``_build_qwen3_layers``;
the router's top-k renormalisation is the checkpoint's ``norm_topk_prob`` and torchtitan's
aux-loss-free expert bias is on only when ``load_balance_coeff`` is given.  The first expert
call of each rank logs one ``[MoE]`` line: which grouped GEMM ran, on which device, and the
load balancing in force (docs/moe.md).
"""

from __future__ import annotations

from typing import Any


def qwen3_model_spec(
    *,
    name: str,
    dim: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    ffn_dim: int,
    vocab_size: int,
    tied: bool,
    rope_theta: float,
    max_seq_len: int,
    attn_backend: str = "flex",
    norm_eps: float = 1e-6,
    fuse_qkv: bool = True,
    num_experts: int = 0,
    top_k: int = 0,
    moe_ffn_dim: int = 0,
    route_norm: bool = True,
    dense_layers: tuple[int, ...] = (),
    load_balance_coeff: float | None = None,
    balance_note: str = "",
) -> Any:
    """A Qwen3 ``ModelSpec`` (torchtitan 0.3 layout): dense, or MoE when ``num_experts`` is set
    (``dense_layers``: the layers of a mix that keep a dense MLP of ``ffn_dim``).
    ``fuse_qkv=False`` builds separate q/k/v projections (LoRA: one adapter each, as peft has them)."""
    from torchtitan.components.optimizer import register_moe_load_balancing_hook
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models import qwen3 as q
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.protocols.model_spec import ModelSpec

    embedding_init = q._EMBEDDING_SKIP_INIT if tied else q._EMBEDDING_INIT
    rope = CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=rope_theta)
    common = dict(fuse_qkv=fuse_qkv, n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
                  head_dim=head_dim, attn_backend=attn_backend, rope=rope)
    if num_experts:
        layers = q._build_qwen3_moe_layers(
            **common, moe_hidden_dim=moe_ffn_dim, num_experts=num_experts, top_k=top_k, moe_comm_backend="standard",
        )
        for layer in layers:
            layer.moe.router.route_norm = route_norm  # HF norm_topk_prob (torchtitan's builder: True)
            layer.moe.load_balance_coeff = load_balance_coeff
        if dense_layers:
            dense = q._build_qwen3_layers(**common, hidden_dim=ffn_dim)
            layers = [dense[i] if i in dense_layers else layer for i, layer in enumerate(layers)]
        log_experts_path(num_experts, top_k, balance_note)
    else:
        layers = q._build_qwen3_layers(**common, hidden_dim=ffn_dim)
    model = q.Qwen3Model.Config(
        vocab_size=vocab_size,
        dim=dim,
        norm=RMSNorm.Config(normalized_shape=dim, eps=norm_eps, param_init=q._NORM_INIT),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(num_embeddings=vocab_size, embedding_dim=dim, param_init=embedding_init),
        lm_head=Linear.Config(in_features=dim, out_features=vocab_size, param_init=q._LINEAR_INIT),
        layers=layers,
    )
    if norm_eps != q._EPS:
        for layer in model.layers:
            for norm in (layer.attention_norm, layer.ffn_norm, layer.attention.qk_norm):
                if norm is not None:
                    norm.eps = norm_eps
    return ModelSpec(
        name="qwen3",
        flavor=name,
        model=model,
        parallelize_fn=q.parallelize_qwen3,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=register_moe_load_balancing_hook,
        state_dict_adapter=q.Qwen3StateDictAdapter,
    )


def set_rope_theta(model_spec: Any, theta: float) -> None:
    """Use the checkpoint's rotary base on a registered flavor (e.g. Qwen3-4B-2507: 5e6)."""
    from torchtitan.models.common import RoPE

    for _fqn, rope, _parent, _attr in model_spec.model.traverse(RoPE.Config):
        rope.theta = theta


MOE_TAG = "[MoE]"


_EXPERTS: dict = {"note": None, "done": False}


def log_experts_path(num_experts: int, top_k: int, balance_note: str) -> None:
    """Ask for the ``[MoE]`` line in this rank: the first grouped GEMM logs which one ran, on which
    device and dtype, with the load balancing in force.  The config module calls this; trnqwen's
    trainer (:mod:`trnqwen.runtime.trainer`) then calls :func:`observe_experts` on the built model."""
    _EXPERTS["note"] = (num_experts, top_k, balance_note)


def observe_experts(model_parts: list) -> int:
    """Give each of torchtitan's ``GroupedExperts`` modules an observing ``_grouped_mm`` (its
    documented seam, set on the instance: same op, same arguments); the first call of the rank
    logs the ``[MoE]`` line.  Nothing unless :func:`log_experts_path` asked; returns the count."""
    if _EXPERTS["note"] is None:
        return 0
    import logging
    import os
    import types

    from torchtitan.models.common.moe import GroupedExperts

    def _grouped_mm(self, *, A, B_t, offs):
        if not _EXPERTS["done"]:
            _EXPERTS["done"] = True
            experts, k, note = _EXPERTS["note"]
            logging.getLogger().info(
                f"{MOE_TAG} experts: torch._grouped_mm on {A.device.type} ({A.dtype}, torchtitan GroupedExperts; "
                f"{experts} experts, top-{k}); load balancing: {note or 'none'} rank={os.environ.get('RANK', '0')}"
            )
        return type(self)._grouped_mm(self, A=A, B_t=B_t, offs=offs)

    count = 0
    for part in model_parts:
        for module in part.modules():
            if isinstance(module, GroupedExperts):
                module._grouped_mm = types.MethodType(_grouped_mm, module)
                count += 1
    return count
