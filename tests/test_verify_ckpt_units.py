"""verify-ckpt's parts on their own: the analytic Qwen3 spec against transformers' real model,
header validation against the safetensors library, the bit-level NaN/Inf scan against float
checks, and keys-vs-headers against a real ``load_state_dict``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ckpt_fixtures import make_case, write_export
from trnqwen.safetensors_format import DTYPES, SafetensorsFormatError, read_header
from trnqwen.ckpt.spec import expected_tensors

# --- the analytic spec is the model's state dict --------------------------------------------------


def _meta_state(config_dict: dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.integers(1, 3),
    heads=st.sampled_from([2, 4, 8]),
    kv_div=st.sampled_from([1, 2]),
    head_dim=st.one_of(st.none(), st.sampled_from([4, 8, 16])),
    hidden=st.sampled_from([16, 32, 48]),
    inter=st.sampled_from([24, 64]),
    vocab=st.integers(10, 200),
    tied=st.booleans(),
    bias=st.booleans(),
    omit_kv=st.booleans(),
)
def test_analytic_spec_equals_meta_model(layers, heads, kv_div, head_dim, hidden, inter, vocab, tied, bias, omit_kv):
    cfg = dict(
        model_type="qwen3", num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied, attention_bias=bias,
    )
    if not omit_kv:
        cfg["num_key_value_heads"] = heads // kv_div
    if head_dim is not None:  # absent: transformers' default (128 for qwen3), not hidden/heads
        cfg["head_dim"] = head_dim
    spec = expected_tensors(cfg)
    assert {k: t.shape for k, t in spec.tensors.items()} == _meta_state(cfg)
    assert spec.expected_missing == (["lm_head.weight"] if tied else [])


def test_analytic_spec_equals_hub_layout_for_qwen3_moe(tmp_path):
    """transformers 5 fuses experts in memory but saves the Hub layout: the spec must match the file."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    c = Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[1],
    )
    AutoModelForCausalLM.from_config(c).save_pretrained(str(tmp_path))
    spec = expected_tensors(json.loads((tmp_path / "config.json").read_text()))
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert {k: t.shape for k, t in spec.tensors.items()} == saved


def test_non_qwen3_model_type_is_a_usage_error():
    from trnqwen.errors import UsageError

    with pytest.raises(UsageError, match="not a Qwen3"):
        expected_tensors({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})


# --- keys vs headers == the recipe's load_state_dict(strict=False) --------------------------------


@pytest.mark.parametrize("variant", ["ok", "removed", "extra", "wrong_shape", "untied_missing_head"])
def test_header_check_equals_real_load_state_dict(tmp_path, variant):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from trnqwen.ckpt import locate, verify
    from trnqwen.ckpt.spec import round_trip

    ckpt, assets, state = make_case(tmp_path, tied=variant != "untied_missing_head")
    victim = "model.layers.1.self_attn.v_proj.weight"
    if variant == "removed":
        state.pop(victim)
    elif variant == "extra":
        state["model.layers.9.mlp.up_proj.weight"] = state[victim].clone()
    elif variant == "wrong_shape":
        state[victim] = torch.zeros(3, 5, dtype=state[victim].dtype)
    elif variant == "untied_missing_head":
        state.pop("lm_head.weight")
    step = next(ckpt.glob("step-*"))
    import shutil

    shutil.rmtree(step)
    write_export(step, state)

    files, mc = locate(ckpt, assets=assets)
    report = verify(files, mc, quick=True)
    shape_bad = {m.key for m in report.mismatched if m.kind == "shape"}

    # The real thing: a CPU model, real tensors, load_state_dict(strict=False) (minus the
    # shape-mismatched tensor, on which torch raises even with strict=False).
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(assets)), dtype=torch.bfloat16)
    loaded = {}
    for f in sorted(step.glob("*.safetensors")):
        loaded.update(load_file(str(f)))
    if shape_bad:
        with pytest.raises(RuntimeError, match="size mismatch"):
            model.load_state_dict(loaded, strict=False)
    real = model.load_state_dict({k: v for k, v in loaded.items() if k not in shape_bad}, strict=False)

    ours_missing = sorted(set(report.missing_keys) | set(report.expected_missing) | shape_bad)
    assert sorted(real.missing_keys) == ours_missing
    assert sorted(real.unexpected_keys) == report.unexpected_keys
    # and the meta-device round trip (--round-trip) says the same, allocating nothing
    rt = round_trip(str(assets), {k: (tuple(v.shape), {torch.bfloat16: "BF16"}[v.dtype]) for k, v in loaded.items()})
    assert rt.missing_keys == ours_missing and rt.unexpected_keys == report.unexpected_keys
    assert report.ok == (variant == "ok")


# --- headers: our validation rejects what safetensors rejects --------------------------------------


def _valid_file(tmp_path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "a.safetensors"
    save_file({"x": torch.arange(6, dtype=torch.float32).view(2, 3), "y": torch.ones(5, dtype=torch.bfloat16)}, str(path))
    return path


def _with_header(raw: bytes, header: dict, pad_data: int = 0) -> bytes:
    (n,) = struct.unpack("<Q", raw[:8])
    data = raw[8 + n:]
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data + b"\0" * pad_data


CORRUPTIONS = {
    "short": lambda raw, hdr: raw[:-3],
    "tiny": lambda raw, hdr: raw[:4],
    "huge_size_field": lambda raw, hdr: struct.pack("<Q", 2**40) + raw[8:],
    "not_json": lambda raw, hdr: raw[:8] + b"\x00" * (struct.unpack("<Q", raw[:8])[0]) + raw[8 + struct.unpack("<Q", raw[:8])[0]:],
    "gap": lambda raw, hdr: _with_header(raw, {**hdr, "y": {**hdr["y"], "data_offsets": [hdr["y"]["data_offsets"][0] + 2, hdr["y"]["data_offsets"][1] + 2]}}),
    "size_vs_shape": lambda raw, hdr: _with_header(raw, {**hdr, "x": {**hdr["x"], "shape": [2, 4]}}),
    "trailing": lambda raw, hdr: raw + b"\0" * 8,
    "bad_dtype": lambda raw, hdr: _with_header(raw, {**hdr, "y": {**hdr["y"], "dtype": "Q7"}}),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_headers_rejected_like_the_library(tmp_path, name):
    from safetensors import safe_open

    path = _valid_file(tmp_path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    path.write_bytes(CORRUPTIONS[name](raw, hdr))
    with pytest.raises(SafetensorsFormatError) as ours:
        read_header(path)
    assert "\n" not in str(ours.value)
    with pytest.raises(Exception):
        with safe_open(str(path), "np") as f:
            for k in f.keys():
                f.get_tensor(k)


def test_valid_header_parsed(tmp_path):
    h = read_header(_valid_file(tmp_path))
    assert {k: (t.dtype, t.shape) for k, t in h.tensors.items()} == {"x": ("F32", (2, 3)), "y": ("BF16", (5,))}
    assert h.data_len == sum(t.nbytes for t in h.tensors.values())


# --- the bit-level scan equals float checks --------------------------------------------------------

FLOAT_NP = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


def _bits_of(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":  # round-to-nearest is irrelevant here: take the top half of float32
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return values.astype(FLOAT_NP[dtype]).tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(["BF16", "F16", "F32", "F64", "I32", "U8"]), st.integers(0, 700), st.integers(0, 5), st.integers(0, 5)),
        min_size=1, max_size=6,
    ),
    chunk=st.sampled_from([1, 3, 7, 64, 1000, 1 << 20]),
    seed=st.integers(0, 2**16),
)
def test_scan_counts_equal_isnan_isinf(tmp_path_factory, specs, chunk, seed):
    """Odd tensor sizes put later tensors at unaligned offsets; odd chunk sizes split elements."""
    from trnqwen.ckpt.scan import scan_nonfinite

    rng = np.random.default_rng(seed)
    header, blobs, want, pos = {}, [], {}, 0
    for i, (dtype, n, nans, infs) in enumerate(specs):
        name = f"t{i}"
        if dtype in ("I32", "U8"):
            raw = rng.integers(0, 255, n * DTYPES[dtype].itemsize, dtype=np.uint8).tobytes()  # any bits: never "non-finite"
        else:
            vals = rng.normal(0, 1e3, n)
            nan_idx = rng.choice(n, min(nans, n), replace=False) if n else []
            vals[nan_idx] = np.nan
            rest = np.setdiff1d(np.arange(n), nan_idx)
            inf_idx = rng.choice(rest, min(infs, len(rest)), replace=False) if len(rest) else []
            vals[inf_idx] = rng.choice([np.inf, -np.inf], len(inf_idx))
            raw = _bits_of(vals, dtype)
            if len(nan_idx) or len(inf_idx):
                want[name] = (len(nan_idx), len(inf_idx))
        header[name] = {"dtype": dtype, "shape": [n], "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    h = json.dumps(header).encode()
    path = tmp_path_factory.mktemp("scan") / "s.safetensors"
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    for workers in (1, 3):  # the threaded scan must merge windows exactly like a serial one
        seen = []
        found = scan_nonfinite([read_header(path)], progress=seen.append, chunk=chunk, workers=workers)
        assert {k: (v.nan, v.inf) for k, v in found.items()} == want
        assert sum(seen) == pos


def test_float8_rules():
    """e5m2 has Inf and NaN; e4m3fn has no Inf, only S.1111.111 is NaN."""
    import torch

    from trnqwen.ckpt.scan import _count_block

    for dtype, torch_dtype in (("F8_E5M2", torch.float8_e5m2), ("F8_E4M3", torch.float8_e4m3fn)):
        every = torch.arange(256, dtype=torch.uint8)
        as_float = every.view(torch_dtype).float()
        d = DTYPES[dtype]
        nan, inf = _count_block(np, every.numpy(), d.abs_mask, d.exp_all_ones, np.empty(16, np.uint8))
        assert (nan, inf) == (int(as_float.isnan().sum()), int(as_float.isinf().sum()))


def test_chunk_plan_ends_on_element_boundaries():
    from trnqwen.safetensors_format import TensorInfo
    from trnqwen.ckpt.scan import _chunk_plan

    tensors = [TensorInfo("a", "BF16", (3,), 0, 6), TensorInfo("b", "F32", (5,), 6, 26), TensorInfo("c", "F64", (2,), 26, 42)]
    plan = _chunk_plan(tensors, 42, 8)
    assert plan[0][0] == 0 and plan[-1][1] == 42
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:]))
    for begin, end in plan:
        for t in tensors:
            if t.begin < end < t.end:
                assert (end - t.begin) % DTYPES[t.dtype].itemsize == 0
