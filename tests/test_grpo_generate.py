"""GRPO's in-process generator on the tiny Qwen3: HF (transformers' Qwen3ForCausalLM, what hf-v5
and hf-trainer train) and torchtitan's native decoder built from the same weights.

* the key-value cache and full recompute give the same greedy completions, on both models, and
  the native model's equal transformers' (an independent implementation of the same network);
* sampling is seeded by (seed, step, rank): the same draws again, other draws on another rank or
  step; the global RNG is untouched; top-k=1 is greedy;
* fixed shapes: prompts left-padded to the bucket, completions padded to max_completion_length,
  masks up to and including <|im_end|>, is_truncated; the number of forwards is fixed unless
  every row has ended;
* the native model's own attention modules are back in place after a rollout.

``test_speed_of_the_cache`` prints new tokens/s both ways (tiny Qwen3, 4 layers, hidden 128; 2
prompts x 4 generations, 32 new tokens, one torch thread).  On this project's loaded 2-core box,
new tokens/s cached vs recomputed: 32 tokens, 8 rows: HF 181-255 vs 38-46, native 207-219 vs
38-51; 128 tokens, 8 rows: HF 160 vs 18, native 207 vs 22.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PROMPTS = [
    [{"role": "user", "content": "What is 2 plus 3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour you like a lot."}],
    [{"role": "user", "content": "Hi"}],
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared CPU, threads spinning against other processes make a tiny
    model's forward 20x slower (and the speed numbers noise)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("grpo-gen") / "tiny-qwen3")


@pytest.fixture(scope="module")
def tok(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True))["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def hf(tiny):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)


@pytest.fixture(scope="module")
def native(tiny):
    return build_native(tiny)


def build_native(tiny: Path, *, trainable: bool = False):
    """torchtitan's native Qwen3 with the snapshot's weights (as tests/test_tiny_model.py builds it);
    ``trainable``: with the CPU dense attention the native backend trains with (flex has no CPU backward)."""
    from safetensors.torch import load_file
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    from trnqwen.fetch import builtin
    from trnqwen.runtime.qwen3_native import qwen3_model_spec
    from trnqwen.titan_compat import dims_from_hf_config

    # built as a run builds it: config.json's dims (titan_compat) -> the runtime's model spec
    config = json.loads((tiny / "config.json").read_text())
    d = dims_from_hf_config(config)
    cfg = qwen3_model_spec(
        name="tiny", dim=d.dim, n_layers=d.n_layers, n_heads=d.n_heads, n_kv_heads=d.n_kv_heads, head_dim=d.head_dim,
        ffn_dim=d.ffn_dim, vocab_size=d.vocab_size, tied=d.tied, rope_theta=d.rope_theta,
        max_seq_len=int(config["max_position_embeddings"]), norm_eps=float(config["rms_norm_eps"]), attn_backend="flex",
    ).model
    if trainable:
        from trnqwen.runtime.cpu_attention import cpu_dense_attention

        for layer in cfg.layers:
            layer.attention.inner_attention = cpu_dense_attention(layer.attention.inner_attention)
    model = cfg.build()
    state = Qwen3StateDictAdapter(cfg, str(tiny)).from_hf(load_file(str(tiny / builtin.WEIGHTS_FILE)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    return model


def _gen(model, tok, *, kv_cache=True, rank=0, seed=11, **settings):
    from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings

    settings = {"max_completion_length": 24, "prompt_bucket": 16, **settings}
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    return InProcessGenerator(model, SamplingSettings(**settings), pad_id=tok.pad_token_id, eos_ids=eos, seed=seed,
                              rank=rank, kv_cache=kv_cache)


@pytest.mark.parametrize("which", ["hf", "native"])
def test_cache_and_recompute_give_the_same_greedy_completions(which, request, tok, prompts):
    model = request.getfixturevalue(which)
    cached = _gen(model, tok, do_sample=False).generate(prompts, num_generations=2, step=0)
    full = _gen(model, tok, do_sample=False, kv_cache=False).generate(prompts, num_generations=2, step=0)
    assert torch.equal(cached.completion_ids, full.completion_ids)
    assert torch.equal(cached.completion_mask, full.completion_mask)
    longest = max(len(p) for p in prompts)
    assert cached.completion_ids.shape == (6, 24) and cached.prompt_ids.shape == (6, -(-longest // 16) * 16)
    assert torch.equal(cached.completion_ids[0], cached.completion_ids[1])  # greedy: a group's rows are equal
    assert cached.forwards == full.forwards


def test_a_qwen3_moe_decoder_rolls_out_with_the_cache_as_without_it():
    """GRPO on a Qwen3-MoE (native, and nki-moe, whose ranks run torchtitan's decoder with
    torchtitan-neuron's experts): the native decoder's cache swap leaves the routed experts alone;
    cached and recomputed greedy completions are the same, and every forward ran through the experts."""
    from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings
    from trnqwen.runtime.qwen3_native import qwen3_model_spec

    torch.manual_seed(0)
    spec = qwen3_model_spec(name="moe", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128,
                            vocab_size=512, tied=False, rope_theta=1e6, max_seq_len=256, num_experts=4, top_k=2,
                            moe_ffn_dim=32)
    model = spec.model.build()
    model.init_weights()
    calls = []
    for layer in model.layers.values():
        layer.moe.register_forward_hook(lambda *_: calls.append(1))
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    out = {}
    for kv_cache in (True, False):
        calls.clear()
        generator = InProcessGenerator(model, SamplingSettings(max_completion_length=8, do_sample=False, prompt_bucket=8),
                                       pad_id=0, eos_ids=[511], kv_cache=kv_cache)
        out[kv_cache] = generator.generate(prompts, num_generations=2)
        assert len(calls) == 2 * out[kv_cache].forwards  # both MoE layers at every forward
    assert (out[True].cache_path, out[False].cache_path) == ("titan", "recompute")
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert len({tuple(r) for r in out[True].completion_ids.tolist()}) == 2  # two prompts, two greedy answers


def test_native_and_transformers_agree(hf, native, tok, prompts):
    own = [m.inner_attention for m in native.modules() if hasattr(m, "inner_attention")]
    a = _gen(hf, tok, do_sample=False).generate(prompts, step=0)
    b = _gen(native, tok, do_sample=False).generate(prompts, step=0)
    assert torch.equal(a.completion_ids, b.completion_ids), (a.completion_ids, b.completion_ids)
    after = [m.inner_attention for m in native.modules() if hasattr(m, "inner_attention")]
    assert len(own) == 4 and all(x is y for x, y in zip(own, after))  # the model's own attention is back


def test_sampling_is_seeded_by_seed_step_and_rank(hf, tok, prompts):
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    g = _gen(hf, tok, temperature=1.0, top_p=0.95)
    first = g.generate(prompts, num_generations=4, step=3)
    assert torch.equal(torch.rand(1), before)  # the global RNG was not drawn from
    again = _gen(hf, tok, temperature=1.0, top_p=0.95).generate(prompts, num_generations=4, step=3)
    assert torch.equal(first.completion_ids, again.completion_ids)
    other_rank = _gen(hf, tok, temperature=1.0, top_p=0.95, rank=1).generate(prompts, num_generations=4, step=3)
    other_step = g.generate(prompts, num_generations=4, step=4)
    assert not torch.equal(first.completion_ids, other_rank.completion_ids)
    assert not torch.equal(first.completion_ids, other_step.completion_ids)
    group = first.completion_ids[:4]
    assert len({tuple(r.tolist()) for r in group}) > 1  # a group's completions differ (sampled)
    greedy = _gen(hf, tok, do_sample=False).generate(prompts, step=0)
    top1 = _gen(hf, tok, temperature=0.7, top_k=1).generate(prompts, step=5)
    assert torch.equal(greedy.completion_ids, top1.completion_ids)


def test_native_sampling_matches_transformers_with_the_same_seed(hf, native, tok, prompts):
    a = _gen(hf, tok, temperature=0.8).generate(prompts, num_generations=2, step=1)
    b = _gen(native, tok, temperature=0.8).generate(prompts, num_generations=2, step=1)
    same = (a.completion_ids == b.completion_ids).float().mean().item()
    assert same > 0.9, same  # the same draws on (numerically almost) the same distributions


def test_shapes_masks_and_truncation(hf, tok, prompts):
    from trnqwen.methods.grpo.generate import bucket_length, pad_prompts

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    r = _gen(hf, tok, temperature=1.5, max_completion_length=6, stop_early=False).generate(prompts, num_generations=8, step=2)
    assert r.completion_ids.shape == (24, 6) and r.forwards == 6  # 1 prefill + 5 decode steps, always
    for ids, mask, cut in zip(r.completion_ids.tolist(), r.completion_mask.tolist(), r.is_truncated.tolist()):
        n = sum(mask)
        assert mask == [1] * n + [0] * (6 - n)
        assert cut == (eos not in ids)
        if not cut:
            assert ids.index(eos) == n - 1  # the mask ends with the end-of-turn token
            assert all(t == tok.pad_token_id for t in ids[n:])
    lists = r.completion_lists()
    assert [len(x) for x in lists] == r.completion_lengths.tolist()
    # left padding to the bucket
    for row, p in zip(r.prompt_ids[::8], prompts):
        assert row[-len(p):].tolist() == p and set(row[:-len(p)].tolist()) == {tok.pad_token_id}
    assert bucket_length(0, 16) == 16 and bucket_length(17, 16) == 32 and bucket_length(32, 16) == 32
    with pytest.raises(ValueError):
        pad_prompts([[1, 2, 3]], 0, 2)


def test_the_loop_stops_early_only_when_every_row_has_ended(hf, tok, prompts):
    """A completion that ends at once (its first token is the end-of-turn token) everywhere: the
    loop stops after one forward when allowed, and runs every step when not."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    bias = torch.zeros(hf.config.vocab_size)
    bias[eos] = 1e4
    handle = hf.lm_head.register_forward_hook(lambda mod, args, out: out + bias)
    try:
        early = _gen(hf, tok, do_sample=False, max_completion_length=8).generate(prompts, num_generations=2)
        fixed = _gen(hf, tok, do_sample=False, max_completion_length=8, stop_early=False).generate(prompts, num_generations=2)
    finally:
        handle.remove()
    assert early.forwards == 1 and fixed.forwards == 8
    assert (early.completion_ids[:, 0] == eos).all() and early.completion_lengths.tolist() == [1] * 6
    assert torch.equal(early.completion_ids, fixed.completion_ids) and not early.is_truncated.any()


def test_prompts_already_padded_to_a_fixed_room(hf, tok, prompts):
    from trnqwen.methods.grpo.generate import pad_prompts

    g = _gen(hf, tok, temperature=1.0)
    bucketed = g.generate(prompts, num_generations=2, step=1, micro=3)
    ids, mask = pad_prompts(prompts, tok.pad_token_id, bucketed.prompt_ids.shape[1])
    ids[mask == 0] = 5  # whatever sits under the mask is not read
    padded = g.generate_padded(ids, mask, num_generations=2, step=1, micro=3)
    assert torch.equal(bucketed.completion_ids, padded.completion_ids)
    assert not torch.equal(g.generate(prompts, num_generations=2, step=1, micro=4).completion_ids, padded.completion_ids)
    wide_ids, wide_mask = pad_prompts(prompts, tok.pad_token_id, 64)  # more room: the same greedy completions
    greedy = _gen(hf, tok, do_sample=False)
    assert torch.equal(greedy.generate(prompts).completion_ids, greedy.generate_padded(wide_ids, wide_mask).completion_ids)
    with pytest.raises(ValueError, match="left-padded"):
        g.generate_padded(wide_ids, wide_mask.flip(1))


def test_refusals(hf, tok):
    from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings

    with pytest.raises(ValueError):
        InProcessGenerator(hf, SamplingSettings(8, temperature=0.0), pad_id=0, eos_ids=[1])
    with pytest.raises(ValueError):
        InProcessGenerator(hf, SamplingSettings(8), pad_id=0, eos_ids=[])
    with pytest.raises(ValueError):
        InProcessGenerator(hf, SamplingSettings(8), pad_id=0, eos_ids=[1], kind="vllm")


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)])
def test_the_preallocated_cache_draws_what_transformers_cache_draws(hf, tok, prompts, settings):
    """HF rollouts keep each layer's keys/values in one buffer ("preallocated", the default path,
    asserted); transformers' own growing cache ("dynamic") gives bit-identical logits at every
    step, so the same seeded draws."""
    from trnqwen.methods.grpo.generate import _HFCached

    fast = _gen(hf, tok, **settings).generate(prompts, num_generations=4, step=7)
    slow = _gen(hf, tok, **settings)
    slow.preallocate_cache = False
    plain = slow.generate(prompts, num_generations=4, step=7)
    assert (fast.cache_path, plain.cache_path) == ("preallocated", "dynamic")
    assert torch.equal(fast.completion_ids, plain.completion_ids) and torch.equal(fast.completion_mask, plain.completion_mask)
    assert fast.completion_mask.sum() > 2 * len(prompts) * 4  # completions of more than a token or two
    # step by step: the same logits, bit for bit, through prefill, the groups' expansion and decoding
    ids, mask = fast.prompt_ids[::4], fast.prompt_mask[::4]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    total = ids.shape[1] + 8
    decoders = [_HFCached(hf, preallocate=True), _HFCached(hf, preallocate=False)]
    with torch.no_grad():
        logits = [d.start(ids, mask, positions, total) for d in decoders]
        assert torch.equal(*logits)
        for d in decoders:
            d.expand(2)
        for t in range(7):
            tokens = torch.arange(ids.shape[0] * 2) * 37 + t * 5 + 10
            logits = [d.step(tokens, t) for d in decoders]
            assert torch.equal(*logits), t
    assert decoders[0].cache.layers[0].keys.shape[-2] == ids.shape[1] + 7
    assert [d.path for d in decoders] == ["preallocated", "dynamic"]


@pytest.mark.parametrize("settings", [dict(do_sample=False), dict(temperature=0.7, top_p=0.9)])
def test_fixed_shapes_attend_the_whole_buffer_and_draw_what_the_growing_cache_draws(hf, tok, prompts, settings):
    """On Neuron every new shape is a new graph: the HF decoder's "static" path (fixed_shapes, the
    default off the CPU and CUDA) attends over the whole [rows, P + C] buffer at every step, the
    slots not written yet masked, so its key/value shapes never change; its logits equal the
    growing cache's to float rounding and its completions (greedy and seeded) are the same."""
    from trnqwen.methods.grpo.generate import _HFCached

    fixed = _gen(hf, tok, **settings)
    fixed.fixed_shapes = True
    got = fixed.generate(prompts, num_generations=3, step=5)
    want = _gen(hf, tok, **settings).generate(prompts, num_generations=3, step=5)
    assert (got.cache_path, want.cache_path) == ("static", "preallocated")
    assert torch.equal(got.completion_ids, want.completion_ids) and torch.equal(got.completion_mask, want.completion_mask)
    assert got.forwards == want.forwards and got.completion_mask.sum() > 2 * len(prompts) * 3
    # step by step: one key/value shape throughout, the logits those of the growing view
    ids, mask = want.prompt_ids[::3], want.prompt_mask[::3]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    total = ids.shape[1] + 8
    decoders = [_HFCached(hf, fixed=True), _HFCached(hf)]
    with torch.no_grad():
        logits = [d.start(ids, mask, positions, total) for d in decoders]
        torch.testing.assert_close(*logits, rtol=1e-5, atol=1e-5)
        for d in decoders:
            d.expand(2)
        shapes = set()
        for t in range(7):
            tokens = torch.arange(ids.shape[0] * 2) * 37 + t * 5 + 10
            logits = [d.step(tokens, t) for d in decoders]
            torch.testing.assert_close(*logits, rtol=1e-5, atol=1e-5)
            shapes.add((tuple(decoders[0].cache.layers[0].keys.shape), tuple(decoders[0].full_mask.shape)))
    assert shapes == {((ids.shape[0] * 2, hf.config.num_key_value_heads, total, hf.config.head_dim),
                       (ids.shape[0] * 2, total))}
    assert decoders[1].cache.layers[0].keys.shape[-2] == ids.shape[1] + 7  # the growing view's


@pytest.mark.parametrize("which", ["hf", "native"])
def test_a_compiled_model_traces_a_rollout_in_two_graphs(which, request, tiny, tok):
    """What Neuron needs, checked with torch.compile on the CPU (``dynamic=False``: a new shape or a
    new constant is a new graph, as a new shape is a new NEFF on Neuron): a fixed-shape rollout
    traces its prefill and its decoding step once each, however many tokens it draws (HF: the
    "static" path; native: the cache's slots handed over as a tensor).  transformers' growing view
    traces one graph per forward: the count can fail."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32) if which == "hf" else build_native(tiny)
    model.forward = torch.compile(model.forward, backend="eager", dynamic=False)
    runs = [(True, 6)] + ([(False, 3)] if which == "hf" else [])
    try:
        for fixed, tokens in runs:
            dynamo.reset()
            counters.clear()
            generator = _gen(model, tok, do_sample=False, max_completion_length=tokens, stop_early=False)
            generator.fixed_shapes = fixed
            out = generator.generate([[5, 6, 7, 8], [9, 10]], num_generations=2)
            assert out.forwards == tokens and out.cache_path == {"hf": "static" if fixed else "preallocated",
                                                                 "native": "titan"}[which]
            assert counters["stats"]["unique_graphs"] == (2 if fixed else tokens), (fixed, dict(counters["stats"]))
    finally:
        dynamo.reset()


def test_the_native_prefill_computes_the_lm_head_on_its_last_position_only(native, tok, prompts):
    """torchtitan's decoder: the prefill's hidden states (its ``_skip_lm_head``), then the head on the
    last position ("last", asserted): the logits of the whole head's last position, and the same
    greedy and sampled completions as recompute (which runs the whole head)."""
    from trnqwen.methods.grpo.generate import _TitanDecoder, pad_prompts

    calls = []
    handle = native.lm_head.register_forward_hook(lambda mod, args, out: calls.append(tuple(args[0].shape)))
    try:
        cached = _gen(native, tok, do_sample=False).generate(prompts, num_generations=2)
    finally:
        handle.remove()
    full = _gen(native, tok, do_sample=False, kv_cache=False).generate(prompts, num_generations=2)
    assert (cached.prefill_head, full.prefill_head) == ("last", "full")
    assert calls[0] == (len(prompts), 1, native.lm_head.in_features)  # [rows, 1, dim]: the last position only
    assert torch.equal(cached.completion_ids, full.completion_ids)
    assert native._skip_lm_head is False  # put back
    ids, mask = pad_prompts(prompts, tok.pad_token_id, 48)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    decoder = _TitanDecoder(native, cache=True)
    with torch.no_grad(), decoder.installed(56):
        last = decoder.start(ids, mask, positions, 56)
    reference = _TitanDecoder(native, cache=False)
    with torch.no_grad(), reference.installed(56):
        whole = reference.start(ids, mask, positions, 56)
    assert decoder.prefill_head == "last" and reference.prefill_head == "full"
    assert torch.allclose(last, whole, atol=1e-5, rtol=0), (last - whole).abs().max()


def test_cpu_rollouts_run_with_their_own_thread_count_and_put_torchs_back(hf, tok, prompts):
    """On the CPU a rollout runs with ``cpu_threads`` torch threads when given (the count it ran
    with is in the Rollout) and leaves torch's setting as it was; by default torch's own; the draws
    do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        mine = _gen(hf, tok, temperature=1.0)
        mine.cpu_threads = 1
        one = mine.generate(prompts, num_generations=2, step=3)
        assert one.threads == 1 and torch.get_num_threads() == 2
        two = _gen(hf, tok, temperature=1.0).generate(prompts, num_generations=2, step=3)
        assert two.threads == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one.completion_ids, two.completion_ids)


@pytest.mark.parametrize("which", ["hf", "native"])
def test_speed_of_the_cache(which, request, tok, prompts, capsys):
    """Cached decoding beats recompute (printed: new tokens per second, both ways)."""
    model = request.getfixturevalue(which)
    rates = {}
    for cache in (True, False):
        g = _gen(model, tok, kv_cache=cache, temperature=1.0, max_completion_length=32, stop_early=False)
        g.generate(prompts[:1], num_generations=1)  # warm-up
        r = g.generate(prompts[:2], num_generations=4, step=1)
        rates[cache] = r.completion_ids.numel() / r.seconds
    with capsys.disabled():
        print(f"\n[{which}] new tokens/s: kv cache {rates[True]:.0f}, recompute {rates[False]:.0f}")
    assert rates[True] > rates[False]


def _load(which: str, tiny: Path):
    if which == "hf":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    return build_native(tiny, trainable=True)


def _fsdp_worker(rank: int, world: int, init_file: str, tiny: str, out_dir: str, which: str, prompts: list) -> None:
    """One rank: the model sharded with FSDP2 over gloo; rank 0's rows end at once when ``stop0``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        tok = AutoTokenizer.from_pretrained(tiny)
        model = _load(which, Path(tiny))
        mesh = init_device_mesh("cpu", (world,))
        for layer in (model.model.layers if which == "hf" else model.layers.values()):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        mine = prompts[rank]
        out = {}
        _gen(model, tok, max_completion_length=2).generate(mine[:1])  # warm-up (FSDP's lazy init)
        for gather in (True, False):
            g = _gen(model, tok, rank=rank, temperature=1.0, max_completion_length=10)
            g.gather_weights = gather
            sampled = g.generate(mine, num_generations=2, step=5)
            out[f"sampled_{gather}"], out[f"forwards_{gather}"] = sampled.completion_ids, sampled.forwards
            out[f"seconds_{gather}"] = sampled.seconds
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        bias = torch.zeros(model.config.vocab_size)
        bias[eos] = 1e4
        handle = model.lm_head.register_forward_hook(lambda mod, args, res: res + bias) if rank == 0 else None
        early = _gen(model, tok, do_sample=False, max_completion_length=10).generate(mine, num_generations=2)
        out["early_forwards"], out["early"] = early.forwards, early.completion_ids
        if handle is not None:
            handle.remove()
        # FSDP trains as before: sharded weights again, a forward/backward gives sharded gradients
        ids = torch.tensor([mine[0]])
        if which == "hf":
            logits = model(input_ids=ids).logits
        else:
            positions = torch.arange(ids.shape[1])[None]
            logits = model(ids, positions, model.get_attention_masks(positions))
        logits.float().logsumexp(-1).mean().backward()
        params = list(model.parameters())
        out["sharded"] = all(type(p).__name__ == "DTensor" and p.to_local().numel() < p.numel() for p in params
                             if p.numel() >= 2)
        out["grads"] = all(p.grad is not None for p in params)
        torch.save(out, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["hf", "native"])
def test_two_fsdp_ranks_draw_their_own_completions_with_the_same_forwards(which, request, tiny, tok, prompts, tmp_path):
    """2 CPU ranks, the model sharded by FSDP2: each rank's rollout equals the unsharded model's for
    that rank (its own seed), and a rank whose rows all end at once keeps calling forward until the
    other rank's rows end too (no rank leaves FSDP's collectives early)."""
    import torch.multiprocessing as mp

    split = [prompts[:2], prompts[2:]]
    mp.spawn(_fsdp_worker, args=(2, str(tmp_path / "init"), str(tiny), str(tmp_path), which, split), nprocs=2)
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    model = request.getfixturevalue(which)
    for rank in range(2):
        alone = _gen(model, tok, rank=rank, temperature=1.0, max_completion_length=10).generate(
            split[rank], num_generations=2, step=5)
        for gather in (True, False):  # weights gathered once per rollout, or at every forward
            assert torch.equal(got[rank][f"sampled_{gather}"], alone.completion_ids), (rank, gather)
            assert got[rank][f"forwards_{gather}"] == alone.forwards
        assert got[rank]["sharded"] and got[rank]["grads"]
    print(f"\n[{which}] 2 FSDP ranks, rollout seconds: gathered once {got[0]['seconds_True']:.2f}, "
          f"at every forward {got[0]['seconds_False']:.2f}")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert (got[0]["early"][:, 0] == eos).all() and not (got[1]["early"][:, 0] == eos).all()
    assert got[0]["early_forwards"] == got[1]["early_forwards"] == 10
