"""Rollouts: the one generation interface GRPO uses, and the in-process generator behind it.

Public API (names are stable; the rank integration builds on them):

* :class:`Generator` (protocol): ``generate(prompts, *, num_generations, step, micro) -> Rollout``.
  A served engine (vLLM Neuron) can take over later by implementing it;
* :class:`SamplingSettings`: ``max_completion_length``, ``temperature``, ``top_p``, ``top_k``,
  ``do_sample`` (False: greedy, for eval), ``prompt_bucket``, ``stop_early``;
* :class:`Rollout`: fixed shapes: ``prompt_ids``/``prompt_mask`` ``[B, P]`` left-padded to a
  bucket, ``completion_ids``/``completion_mask`` ``[B, C]`` right-padded to
  ``max_completion_length`` (the mask covers the tokens up to and including the first
  end-of-turn token), ``is_truncated`` ``[B]`` (no end within C), ``forwards`` (model calls made),
  ``seconds``; ``completion_lists()`` gives TRL's unpadded ``completion_ids`` lists;
* :class:`InProcessGenerator`: the default, on the policy being trained, for HF causal LMs
  (hf-v5's and hf-trainer's ``Qwen3ForCausalLM``) and torchtitan's native decoder; besides
  ``generate`` (token-id lists, padded to a bucket) it takes prompts already left-padded to a fixed
  room: ``generate_padded(prompt_ids, prompt_mask, ...)``;
* :func:`gathered_weights`: FSDP2's sharded weights gathered once for a whole rollout (the
  generator does it unless ``gather_weights=False``);
* :func:`sampling_seed`, :func:`bucket_length`, :func:`pad_prompts`, :func:`sample_tokens`.

Rows are prompt-major: prompt 0's ``num_generations`` completions, then prompt 1's (TRL's order,
what :func:`trnqwen.methods.grpo.loss.group_advantages` groups by).  Each prompt is prefilled
once and its state repeated for its generations.

**Sampling** (temperature, then top-k, then top-p, as transformers' warpers) draws from its own
``torch.Generator`` on the CPU, seeded by :func:`sampling_seed` (seed, step, rank, micro-batch):
the same prompts at the same step on the same rank draw the same completions, so a resumed run repeats an
uninterrupted one; ranks draw differently.  The global RNG is never touched.

**A fixed number of forwards.** Under FSDP every rank must call the model the same number of
times, and Neuron wants fixed shapes: the decode loop runs ``max_completion_length`` steps (one
prefill, then one forward per new token) on every rank.  ``stop_early`` ends it sooner only when
every row of every rank has ended (one ``all_reduce`` per step when ``torch.distributed`` runs).

**Key-value cache.** HF models use transformers' own ``DynamicCache`` (its ``cache`` argument), each
full-attention layer's keys and values kept in one buffer allocated at the prefill for the whole
rollout (``preallocate_cache``; transformers' layer concatenates the whole cache at every new
token); the attention sees the same tensors either way, so the draws are the same (tested).
torchtitan's native decoder has no cache, so the generator gives it one without touching its
code: for the rollout, each attention's ``inner_attention`` submodule is swapped for
:class:`_CachedAttention`, which receives q/k/v after the model's own projections, norms and RoPE,
writes k/v into a preallocated ``[B, P + C]`` buffer and attends over it with a padding + causal
mask (fixed shapes every step); the model's own modules are put back afterwards.  ``kv_cache=
False`` recomputes instead: every step runs the whole ``[B, P + C]`` buffer through the model
(fixed shape, no state), which costs about ``C / 2`` times the cached rollout's compute; it is kept
as the reference the cache is tested against (greedy completions equal) and for engines with no
cache.  The numbers on the tiny model are in ``tests/test_grpo_generate.py``'s docstring.

**Less work, the same draws.** The prefill computes the LM head on its last position only (HF:
``logits_to_keep=1``; torchtitan: its ``_skip_lm_head``, then the head on the last hidden state),
not ``[B, P, V]`` logits.  On the CPU a rollout can run with its own torch thread count
(``cpu_threads``; 1 wins by far on a CPU shared with other work, loses ~1.3x on a quiet one), the
setting put back afterwards.  Each :class:`Rollout` says which paths ran
(``cache_path``, ``prefill_head``, ``threads``).  ``benchmarks/grpo.py`` measures rollouts against
TRL's ``GRPOTrainer`` generating with transformers.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SamplingSettings:
    max_completion_length: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut (TRL's default)
    do_sample: bool = True  # False: greedy (eval's pass@1)
    prompt_bucket: int = 64  # prompts are left-padded to a multiple of this (fixed shapes)
    stop_early: bool = True  # end the loop once every row of every rank has ended


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # [B, P] left-padded with pad_id
    prompt_mask: torch.Tensor  # [B, P] 1 on the prompt's tokens
    completion_ids: torch.Tensor  # [B, C] right-padded with pad_id
    completion_mask: torch.Tensor  # [B, C] 1 up to and including the end-of-turn token
    is_truncated: torch.Tensor  # [B] bool: no end-of-turn token within C
    forwards: int = 0  # model calls made (the same on every rank)
    seconds: float = 0.0
    # which paths ran (a fast path that can fall back says so): the key-value cache ("preallocated",
    # "dynamic", "static": one shape every step, "titan", "recompute"), the prefill's LM head ("last":
    # the last position only, "full"), and torch's CPU threads during the rollout (None: not on the CPU)
    cache_path: str = ""
    prefill_head: str = ""
    threads: Optional[int] = None

    def completion_lists(self) -> list[list[int]]:
        """Each completion's tokens, unpadded (TRL's ``completion_ids`` for reward functions)."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.completion_ids, self.completion_mask)]

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)


class Generator(Protocol):
    """What GRPO asks of a rollout engine."""

    def generate(self, prompts: Sequence[Sequence[int]], *, num_generations: int, step: int, micro: int = 0) -> Rollout:
        """``num_generations`` completions of each prompt (token ids), prompt-major."""
        ...


def sampling_seed(seed: int, step: int, rank: int, micro: int = 0) -> int:
    """One 63-bit seed per (run seed, step, rank, micro-batch), well mixed (numpy's SeedSequence)."""
    import numpy as np

    parts = [int(seed) & 0xFFFFFFFF, int(step), int(rank), int(micro), 0x6E7C]
    state = np.random.SeedSequence(parts).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def bucket_length(n: int, bucket: int) -> int:
    """``n`` rounded up to a multiple of ``bucket`` (at least one bucket)."""
    bucket = max(1, int(bucket))
    return max(bucket, -(-int(n) // bucket) * bucket)


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` ``[len(prompts), length]``, each prompt left-padded with ``pad_id``."""
    ids = torch.full((len(prompts), length), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        n = len(prompt)
        if n > length:
            raise ValueError(f"prompt {i} has {n} tokens, more than the padded length {length}")
        if n:
            ids[i, length - n:] = torch.as_tensor(list(prompt), dtype=torch.long)
            mask[i, length - n:] = 1
    return ids, mask


def sample_tokens(logits: torch.Tensor, settings: SamplingSettings, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One token per row of ``logits`` ``[B, V]`` (float32 on the CPU): greedy, or sampled after
    temperature, top-k and top-p (the smallest set whose probability reaches ``top_p``; the most
    likely token always stays)."""
    logits = logits.float()
    if not settings.do_sample:
        return logits.argmax(-1)
    if settings.temperature != 1.0:  # x / 1.0 is x: the same draws without the copy
        logits = logits / settings.temperature
    if 0 < settings.top_k < logits.shape[-1]:
        kth = torch.topk(logits, settings.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if settings.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1)
        cut = ordered.softmax(-1).cumsum(-1) <= 1 - settings.top_p
        cut[:, -1] = False
        logits = logits.masked_fill(cut.scatter(1, order, cut), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


# --- the models' decoding steps ----------------------------------------------------------------------


def _logits(out) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    if hasattr(logits, "full_tensor"):  # vocab-sharded (TP): gather
        logits = logits.full_tensor()
    return logits


@functools.cache
def _grown_in_place_layer():
    """transformers' ``DynamicLayer`` whose keys/values live in one buffer allocated at the prefill
    for the whole rollout (``[B, H, capacity, D]``); ``keys``/``values`` are views of its filled
    part, the very tensors ``torch.cat`` would have made, without copying the whole cache at every
    new token (``C`` copies of a growing cache: quadratic in the completion length)."""
    from transformers.cache_utils import DynamicLayer

    class GrownInPlace(DynamicLayer):
        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity, self.filled = int(capacity), 0
            self.k_buf = self.v_buf = None

        def update(self, key_states, value_states, *args, **kwargs):
            if self.k_buf is None:
                self.lazy_initialization(key_states, value_states)
                b, h, _, d = key_states.shape
                self.k_buf = key_states.new_empty((b, h, self.capacity, d))
                self.v_buf = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
            n = key_states.shape[-2]
            if self.filled + n > self.capacity:
                raise RuntimeError(f"the rollout's cache holds {self.capacity} positions, not {self.filled + n}")
            self.k_buf[:, :, self.filled:self.filled + n] = key_states
            self.v_buf[:, :, self.filled:self.filled + n] = value_states
            self.filled += n
            self.keys, self.values = self.k_buf[:, :, :self.filled], self.v_buf[:, :, :self.filled]
            return self.keys, self.values

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.k_buf is not None:
                self.k_buf = self.k_buf.repeat_interleave(repeats, dim=0)
                self.v_buf = self.v_buf.repeat_interleave(repeats, dim=0)
                self.keys, self.values = self.k_buf[:, :, :self.filled], self.v_buf[:, :, :self.filled]

    return GrownInPlace


@functools.cache
def _fixed_shape_layer():
    """transformers' ``StaticLayer`` (keys/values ``[B, H, capacity, D]`` from the prefill on, the
    attention over all of them with the padding mask hiding the slots not written yet: one shape at
    every new token, so a Neuron run compiles one decode graph, not one per token), whose batch can
    grow after the prefill: a prompt's state repeated for its generations."""
    from transformers.cache_utils import StaticLayer

    class FixedShape(StaticLayer):
        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.is_initialized:
                self.keys = self.keys.repeat_interleave(repeats, dim=0)
                self.values = self.values.repeat_interleave(repeats, dim=0)
                self.batch_size = self.keys.shape[0]

    return FixedShape


@functools.cache
def _cache_keyword(model_type: type) -> str:
    """The keyword an HF model's forward takes its cache by: ``cache`` from transformers 5.2x on
    (``past_key_values`` deprecated, gone in 5.40), ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


class _HFCached:
    """An HF causal LM with its own ``DynamicCache``, each full-attention layer's keys/values in a
    buffer preallocated for the rollout (:func:`_grown_in_place_layer`; a layer of another kind,
    e.g. a sliding window, keeps transformers' own: ``path`` says "dynamic" then).  ``fixed``: every
    forward attends over the whole buffer (:func:`_fixed_shape_layer`, ``path`` "static"), the
    shapes Neuron compiles once.  The prefill computes the LM head on its last position only
    (``logits_to_keep=1``)."""

    prefill_head = "last"

    def __init__(self, model, preallocate: bool = True, fixed: bool = False) -> None:
        self.model, self.preallocate, self.fixed = model, preallocate, fixed
        self.path = "dynamic"

    def start(self, ids, mask, positions, total: int) -> torch.Tensor:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        self.cache = DynamicCache(config=self.model.config)
        self.cache_kw = {_cache_keyword(type(self.model)): self.cache}
        layers = getattr(self.cache, "layers", None) or []
        plain = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
        b, p = mask.shape
        self.p, self.lengths = p, mask.sum(-1)
        if self.fixed:
            if not plain:  # a sliding window or another kind: no fixed-shape form here
                raise ValueError("fixed shapes need full-attention layers only; this model's cache has others")
            fixed = _fixed_shape_layer()
            self.cache.layers = [fixed(total) for _ in layers]
            self.path = "static"
            # the whole rollout's mask, one shape: the prompt now, each new token's slot set before its step
            self.full_mask = torch.cat([mask, mask.new_zeros(b, total - p)], 1)
            prefill_mask = self.full_mask
        else:
            if self.preallocate and plain:
                grown = _grown_in_place_layer()
                self.cache.layers = [grown(total) for _ in layers]
                self.path = "preallocated"
            # the attention mask for the whole rollout, each step a view of its first p + t + 1 columns
            self.full_mask = torch.cat([mask, mask.new_ones(b, total - p)], 1)
            prefill_mask = mask
        out = self.model(input_ids=ids, attention_mask=prefill_mask, position_ids=positions,
                         **self.cache_kw, use_cache=True, logits_to_keep=1)
        return _logits(out)[:, -1]

    def expand(self, repeats: int) -> None:
        self.cache.batch_repeat_interleave(repeats)
        self.full_mask = self.full_mask.repeat_interleave(repeats, 0)
        self.lengths = self.lengths.repeat_interleave(repeats, 0)

    def step(self, tokens, t: int) -> torch.Tensor:
        if self.fixed:
            self.full_mask[:, self.p + t] = 1
            mask = self.full_mask
        else:
            mask = self.full_mask[:, :self.p + t + 1]
        out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=(self.lengths + t)[:, None],
                         **self.cache_kw, use_cache=True)
        return _logits(out)[:, -1]

    def close(self) -> None:
        self.cache = self.cache_kw = None


class _Recompute:
    """No cache: the whole ``[B, P + C]`` buffer through the model at every step (fixed shape)."""

    path = "recompute"
    prefill_head = "full"

    def __init__(self, forward) -> None:
        self.forward = forward  # (ids, mask, positions) -> logits [B, L, V]

    def start(self, ids, mask, positions, total: int) -> torch.Tensor:
        b, p = ids.shape
        self.p = p
        self.ids = torch.cat([ids, ids.new_zeros(b, total - p)], 1)
        self.mask = torch.cat([mask, mask.new_zeros(b, total - p)], 1)
        return self._run(p - 1)

    def expand(self, repeats: int) -> None:
        self.ids = self.ids.repeat_interleave(repeats, 0)
        self.mask = self.mask.repeat_interleave(repeats, 0)

    def step(self, tokens, t: int) -> torch.Tensor:
        self.ids[:, self.p + t] = tokens.to(self.ids.device)
        self.mask[:, self.p + t] = 1
        return self._run(self.p + t)

    def _run(self, at: int) -> torch.Tensor:
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        return self.forward(self.ids, self.mask, positions)[:, at]

    def close(self) -> None:
        self.ids = self.mask = None


class _CacheState:
    """What every layer's :class:`_CachedAttention` shares during one rollout."""

    def __init__(self, total: int, cache: bool) -> None:
        self.total, self.cache = total, cache
        # where this call's tokens go in the buffer: a tensor, not an int, so a compiled forward sees
        # one input of one shape at every new token instead of a new constant (a recompile) each time
        self.slots: Optional[torch.Tensor] = None
        self.mask: Optional[torch.Tensor] = None  # [B, 1, L, S] bool: which keys each query sees


class _CachedAttention(torch.nn.Module):
    """Stands in for a torchtitan attention's ``inner_attention`` during a rollout: q/k/v come
    ``[B, L, N, H]`` after projections, q/k norms and RoPE; k/v go to this layer's buffer at the
    state's slots and the queries attend over the buffer with the state's mask (SDPA)."""

    def __init__(self, state: _CacheState) -> None:
        super().__init__()
        self.state = state
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None

    def forward(self, q, k, v, *, attention_masks=None, scale=None, enable_gqa=False, **kwargs):
        st = self.state
        if not st.cache:  # recompute: the call holds the whole buffer
            keys, values = k, v
        else:
            if self.k is None:  # the prefill (each rollout installs fresh layers)
                shape = (k.shape[0], st.total, k.shape[2], k.shape[3])
                self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
            self.k.index_copy_(1, st.slots, k)
            self.v.index_copy_(1, st.slots, v)
            keys, values = self.k, self.v
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=st.mask, scale=scale,
            enable_gqa=q.shape[2] != keys.shape[2],
        )
        return out.transpose(1, 2)

    def expand(self, repeats: int) -> None:
        if self.k is not None:
            self.k = self.k.repeat_interleave(repeats, 0)
            self.v = self.v.repeat_interleave(repeats, 0)


def _is_dtensor(x) -> bool:
    return hasattr(x, "placements") and hasattr(x, "device_mesh")


def _attention_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(getattr(m, "inner_attention", None), torch.nn.Module)]


class _TitanDecoder:
    """torchtitan's native decoder (``model(tokens, positions)``), with or without the cache."""

    def __init__(self, model, cache: bool) -> None:
        self.model, self.cache = model, cache
        self.path = "titan" if cache else "recompute"
        self.prefill_head = "full"

    @contextlib.contextmanager
    def installed(self, total: int):
        self.state = _CacheState(total, self.cache)
        owners = _attention_modules(self.model)
        if not owners:
            raise TypeError(f"{type(self.model).__name__} has no attention with an inner_attention module")
        originals = [m.inner_attention for m in owners]
        self.layers = [_CachedAttention(self.state) for _ in owners]
        try:
            for owner, layer in zip(owners, self.layers):
                owner.inner_attention = layer  # an instance's submodule, restored below
            yield self
        finally:
            for owner, original in zip(owners, originals):
                owner.inner_attention = original
            self.layers = []

    def start(self, ids, mask, positions, total: int) -> torch.Tensor:
        b, p = ids.shape
        self.valid = torch.cat([mask.bool(), mask.new_zeros(b, total - p, dtype=torch.bool)], 1)
        self.lengths = mask.sum(-1)
        self.p = p
        if not self.cache:
            self.ids = torch.cat([ids, ids.new_zeros(b, total - p)], 1)
            return self._full(p - 1)
        self.state.slots = torch.arange(p, device=ids.device)
        self.state.mask = self._mask(self.state.slots, total)
        return self._last_logits(ids, positions)

    def _last_logits(self, ids, positions) -> torch.Tensor:
        """The prefill's logits at its last position: the decoder's hidden states (its
        ``_skip_lm_head``), then the LM head on the last position alone ("last": ``[B, V]`` instead
        of ``[B, P, V]``); the whole head where the decoder has no such switch or the head is
        tensor-parallel (DTensor weights or hidden states: "full")."""
        model, head = self.model, getattr(self.model, "lm_head", None)
        if not (hasattr(model, "_skip_lm_head") and isinstance(head, torch.nn.Module)):
            self.prefill_head = "full"
            return _logits(model(ids, positions))[:, -1]
        was = model._skip_lm_head
        model._skip_lm_head = True
        try:
            hidden = model(ids, positions)
        finally:
            model._skip_lm_head = was
        if _is_dtensor(hidden) or any(_is_dtensor(w) for w in head.parameters()):
            self.prefill_head = "full"
            return _logits(head(hidden))[:, -1]
        self.prefill_head = "last"
        return _logits(head(hidden[:, -1:]))[:, -1]

    def expand(self, repeats: int) -> None:
        self.valid = self.valid.repeat_interleave(repeats, 0)
        self.lengths = self.lengths.repeat_interleave(repeats, 0)
        if not self.cache:
            self.ids = self.ids.repeat_interleave(repeats, 0)
            return
        for layer in self.layers:
            layer.expand(repeats)

    def step(self, tokens, t: int) -> torch.Tensor:
        at = self.p + t
        self.valid[:, at] = True
        if not self.cache:
            self.ids[:, at] = tokens.to(self.ids.device)
            return self._full(at)
        self.state.slots = torch.tensor([at], device=self.valid.device)
        self.state.mask = self._mask(self.state.slots, self.state.total)
        positions = (self.lengths + t)[:, None]
        return _logits(self.model(tokens[:, None].to(self.valid.device), positions))[:, -1]

    def _mask(self, query_slots: torch.Tensor, total: int) -> torch.Tensor:
        """[B, 1, Q, S]: a query sees the valid keys at or before its slot, and always itself (a
        padding query attends to itself only, so no row of the softmax is empty)."""
        keys = torch.arange(total, device=query_slots.device)
        causal = keys[None, :] <= query_slots[:, None]  # [Q, S]
        own = keys[None, :] == query_slots[:, None]
        return ((self.valid[:, None, :] & causal[None]) | own[None])[:, None]

    def _full(self, at: int) -> torch.Tensor:
        total = self.ids.shape[1]
        self.state.mask = self._mask(torch.arange(total, device=self.ids.device), total)
        positions = (self.valid.long().cumsum(-1) - 1).clamp(min=0)
        return _logits(self.model(self.ids, positions))[:, at]

    def close(self) -> None:
        self.state.mask = None


@contextlib.contextmanager
def gathered_weights(model):
    """FSDP2: every sharded module's weights all-gathered once for the whole rollout instead of at
    each of its forwards (one forward per new token: ``C`` all-gathers of the whole model), then
    resharded, each module's reshard-after-forward as it was (TRL's ``ds3_gather_for_generation``;
    torchtitan's chunked loss does the same to its ``lm_head``).  Costs the whole model's weights on
    every rank while it lasts.  A model without FSDP is left alone."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        yield
        return
    saved, seen = [], set()
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        if id(state) in seen:  # fully_shard([a, b]): one state for several modules
            continue
        seen.add(id(state))
        saved.append((module, state, state._auto_reshard_after_forward,
                      [g.post_forward_mesh_info for g in state._fsdp_param_groups]))
    try:
        for module, *_ in saved:
            module.set_reshard_after_forward(False, recurse=False)
            module.unshard()
        yield
    finally:
        for module, state, auto, infos in saved:
            # the public setter clears the root's automatic choice (keep the root gathered after
            # its forward); put both back as they were
            state._auto_reshard_after_forward = auto
            for group, info in zip(state._fsdp_param_groups, infos):
                group.post_forward_mesh_info = None if (auto and state._is_root) else info
            module.reshard()


def _is_titan_decoder(model) -> bool:
    return bool(_attention_modules(model)) and not hasattr(model, "generation_config")


def _hf_forward(model):
    def forward(ids, mask, positions):
        return _logits(model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False))
    return forward


@dataclass
class InProcessGenerator:
    """Rollouts from the model being trained, in this process (see the module doc).  ``model``:
    an HF causal LM or torchtitan's native decoder (``kind``: ``"auto"``, ``"hf"``, ``"titan"``);
    ``eos_ids``: the tokens that end a completion (Qwen3's ``<|im_end|>``, the tokenizer's eos);
    ``group``: the process group whose ranks share the FSDP-sharded model (None: the default)."""

    model: torch.nn.Module
    settings: SamplingSettings
    pad_id: int
    eos_ids: Sequence[int]
    seed: int = 0
    rank: int = 0
    kind: str = "auto"
    kv_cache: bool = True
    gather_weights: bool = True  # FSDP: all-gather the weights once per rollout (gathered_weights)
    # the module whose FSDP weights are gathered when it is not ``model`` itself: hf-v5 generates
    # with the HF model inside torchtitan's wrapper, whose root holds the embeddings and lm_head
    weights_root: Optional[torch.nn.Module] = None
    group: Optional[object] = None
    # HF models: each layer's keys/values in one buffer for the whole rollout (False: transformers'
    # own DynamicCache, which copies the cache at every new token)
    preallocate_cache: bool = True
    # HF models: one shape at every decoding step (the whole buffer attended, masked: "static"), what a
    # Neuron run needs to compile once; None: on any device but the CPU and CUDA (which keep the
    # growing view, less work per token).  torchtitan's decoder has fixed shapes either way.
    fixed_shapes: Optional[bool] = None
    # torch's intra-op threads during a rollout on the CPU (None: leave torch's setting, which the
    # launcher makes cpu_count // ranks).  Measured on a 2-core box (benchmarks/RESULTS.md, GRPO): a
    # decode step is many small operations, and on a CPU busy with other work 2 threads waiting at
    # each one's barrier made rollouts 10-25x slower than 1; on a quiet CPU 2 threads were ~1.3x
    # faster.  So it is the caller's choice (the benchmark and the tests pass 1), not a default.
    cpu_threads: Optional[int] = None
    _eos: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind == "auto":
            self.kind = "titan" if _is_titan_decoder(self.model) else "hf"
        if self.kind not in ("hf", "titan"):
            raise ValueError(f"kind must be auto, hf or titan, not {self.kind!r}")
        if self.settings.do_sample and not self.settings.temperature > 0:
            raise ValueError("sampling needs a temperature above 0 (do_sample=False is greedy)")
        if not self.eos_ids:
            raise ValueError("no end-of-turn token ids: a completion could never end")
        self._eos = torch.tensor(sorted({int(i) for i in self.eos_ids}), dtype=torch.long)

    def _device(self) -> torch.device:
        param = next(iter(self.model.parameters()), None)
        device = param.device if param is not None else torch.device("cpu")
        return device

    @contextlib.contextmanager
    def _decoder(self, total: int):
        if self.kind == "titan":
            decoder = _TitanDecoder(self.model, self.kv_cache)
            with decoder.installed(total):
                yield decoder
        else:
            fixed = self.fixed_shapes if self.fixed_shapes is not None else self._device().type not in ("cpu", "cuda")
            yield _HFCached(self.model, self.preallocate_cache, fixed) if self.kv_cache else _Recompute(_hf_forward(self.model))

    def generate(self, prompts: Sequence[Sequence[int]], *, num_generations: int = 1, step: int = 0,
                 micro: int = 0) -> Rollout:
        """``num_generations`` completions of each prompt (token id lists), prompt-major; the
        prompts left-padded to a multiple of ``prompt_bucket``."""
        if not prompts:
            raise ValueError("no prompts to generate from")
        length = bucket_length(max(len(p) for p in prompts), self.settings.prompt_bucket)
        ids, mask = pad_prompts(prompts, self.pad_id, length)
        return self.generate_padded(ids, mask, num_generations=num_generations, step=step, micro=micro)

    def generate_padded(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, num_generations: int = 1,
                        step: int = 0, micro: int = 0) -> Rollout:
        """The same from prompts already left-padded (``[U, P]`` ids and mask, e.g. the fixed prompt
        room of a run): ``num_generations`` completions of each row, prompt-major (pass each
        prompt once: its prefill is shared by its completions)."""
        began = time.perf_counter()
        s = self.settings
        device = self._device()
        ids, mask = prompt_ids.long().cpu(), prompt_mask.long().cpu()
        if ids.shape != mask.shape or ids.dim() != 2 or not ids.shape[0]:
            raise ValueError(f"prompt ids {tuple(ids.shape)} and mask {tuple(mask.shape)} must be one [rows, length]")
        if (mask[:, 1:] < mask[:, :-1]).any():
            raise ValueError("prompts must be left-padded (the mask 0 before the prompt, 1 to the end)")
        length = ids.shape[1]
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, int(self.pad_id)))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        total = length + s.max_completion_length
        rows = ids.shape[0] * num_generations
        generator = torch.Generator(device="cpu").manual_seed(sampling_seed(self.seed, step, self.rank, micro)) \
            if s.do_sample else None
        out = torch.full((rows, s.max_completion_length), int(self.pad_id), dtype=torch.long)
        done = torch.zeros(rows, dtype=torch.bool)
        forwards = 0
        was_training = self.model.training
        threads = torch.get_num_threads()
        on_cpu = device.type == "cpu"
        if on_cpu and self.cpu_threads is not None:
            torch.set_num_threads(int(self.cpu_threads))
        self.model.eval()
        try:
            root = self.weights_root if self.weights_root is not None else self.model
            gathered = gathered_weights(root) if self.gather_weights else contextlib.nullcontext()
            with torch.no_grad(), gathered, self._decoder(total) as decoder:
                logits = decoder.start(ids.to(device), mask.to(device), positions.to(device), total)
                forwards += 1
                if num_generations > 1:
                    logits = logits.repeat_interleave(num_generations, 0)
                    decoder.expand(num_generations)
                for t in range(s.max_completion_length):
                    tokens = sample_tokens(logits.float().cpu(), s, generator)
                    tokens = torch.where(done, torch.full_like(tokens, int(self.pad_id)), tokens)
                    out[:, t] = tokens
                    done |= torch.isin(tokens, self._eos)
                    if t == s.max_completion_length - 1 or (s.stop_early and self._all_done(done, device)):
                        break
                    logits = decoder.step(tokens.to(device), t)
                    forwards += 1
                decoder.close()
                paths = (decoder.path, decoder.prefill_head, torch.get_num_threads() if on_cpu else None)
        finally:
            self.model.train(was_training)
            torch.set_num_threads(threads)
        ended = torch.isin(out, self._eos)
        first_end = torch.where(ended.any(-1), ended.float().argmax(-1), torch.full((rows,), s.max_completion_length))
        completion_mask = (torch.arange(s.max_completion_length)[None] <= first_end[:, None]).long()
        return Rollout(
            prompt_ids=ids.repeat_interleave(num_generations, 0),
            prompt_mask=mask.repeat_interleave(num_generations, 0),
            completion_ids=out,
            completion_mask=completion_mask,
            is_truncated=~ended.any(-1),
            forwards=forwards,
            seconds=time.perf_counter() - began,
            cache_path=paths[0],
            prefill_head=paths[1],
            threads=paths[2],
        )

    def _all_done(self, done: torch.Tensor, device: torch.device) -> bool:
        """Whether every row of every rank has ended (ranks agree: one all_reduce)."""
        local = bool(done.all())
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(self.group) == 1:
            return local
        flag = torch.tensor([0 if local else 1], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag.item()) == 0
