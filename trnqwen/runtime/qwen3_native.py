"""torchtitan-native Qwen3 model specs for sizes torchtitan has no registered flavor for.

Generated config modules call :func:`qwen3_model_spec` with the numbers read from the
checkpoint's ``config.json``; it builds the model config with the same layer builders and
initialisers torchtitan uses for its registered Qwen3 flavors, so the state-dict adapter (HF
checkpoint keys) and sharding work unchanged.
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
) -> Any:
    """A dense Qwen3 ``ModelSpec`` (torchtitan 0.3 layout).  ``fuse_qkv=False`` builds separate
    q/k/v projections (LoRA: one adapter each, as peft has them)."""
    from torchtitan.components.optimizer import register_moe_load_balancing_hook
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models import qwen3 as q
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.protocols.model_spec import ModelSpec

    embedding_init = q._EMBEDDING_SKIP_INIT if tied else q._EMBEDDING_INIT
    model = q.Qwen3Model.Config(
        vocab_size=vocab_size,
        dim=dim,
        norm=RMSNorm.Config(normalized_shape=dim, eps=norm_eps, param_init=q._NORM_INIT),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(num_embeddings=vocab_size, embedding_dim=dim, param_init=embedding_init),
        lm_head=Linear.Config(in_features=dim, out_features=vocab_size, param_init=q._LINEAR_INIT),
        layers=q._build_qwen3_layers(
            fuse_qkv=fuse_qkv,
            n_layers=n_layers,
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            hidden_dim=ffn_dim,
            attn_backend=attn_backend,
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=rope_theta),
        ),
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
