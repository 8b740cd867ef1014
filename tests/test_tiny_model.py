"""builtin:tiny-qwen3: deterministic, offline, loads with transformers and torchtitan's native Qwen3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnqwen.fetch import builtin as tiny_model
from trnqwen.data import corpus_recipe


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tiny_model.write_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "tiny-qwen3")


def test_corpus_files_match_their_recipe():
    rendered = corpus_recipe.render()
    assert rendered[corpus_recipe.TEXT_NAME] == tiny_model.corpus_path().read_text(encoding="utf-8")
    assert rendered[corpus_recipe.CHAT_NAME] == tiny_model.chat_path().read_text(encoding="utf-8")


def test_corpus_is_small_natural_text():
    docs = tiny_model.corpus_documents()
    size = tiny_model.corpus_path().stat().st_size
    assert 50_000 < size < 600_000
    assert len(docs) > 500
    words = " ".join(docs).split()
    assert len(set(words)) > 800  # a real vocabulary, not a repeated sentence
    assert all(doc.isascii() for doc in docs)


def test_snapshot_files_and_config(tiny_dir):
    assert sorted(p.name for p in tiny_dir.iterdir()) == sorted(tiny_model.SNAPSHOT_FILES)
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    assert set(index["weight_map"].values()) == {tiny_model.WEIGHTS_FILE}
    tok_cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]


def test_two_writes_are_byte_identical(tiny_dir, tmp_path):
    again = tiny_model.write_tiny_qwen3(tmp_path / "again")
    assert tiny_model.snapshot_digest(again) == tiny_model.snapshot_digest(tiny_dir)


def test_rewrite_is_atomic_and_refuses_foreign_folders(tmp_path):
    dest = tmp_path / "m"
    tiny_model.write_tiny_qwen3(dest)
    tiny_model.write_tiny_qwen3(dest)  # replacing an earlier tiny snapshot is fine
    assert all((dest / name).is_file() for name in tiny_model.SNAPSHOT_FILES)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    from trnqwen.errors import UsageError

    with pytest.raises(UsageError):
        tiny_model.write_tiny_qwen3(other)
    assert (other / "precious.txt").read_text() == "keep me"


def test_loads_with_transformers_offline(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    params = sum(p.numel() for p in model.parameters())
    assert 100_000 < params <= tiny_model.MAX_PARAMS
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.float32
    assert len(tok) == model.config.vocab_size == tiny_model.VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"

    text = "Once there was a patient tortoise who lived beside a cold clear stream."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2.5  # BPE merges learned from the corpus

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 plus 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
    chat_ids = tok(prompt)["input_ids"]
    assert chat_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.convert_tokens_to_ids("<|im_end|>") in chat_ids

    with torch.no_grad():
        x = torch.tensor([ids])
        loss = model(x, labels=x).loss.item()
    # random init: close to uniform over the vocabulary
    assert abs(loss - torch.log(torch.tensor(float(tiny_model.VOCAB_SIZE))).item()) < 0.5


def test_torchtitan_tokenizer_and_native_qwen3_match_transformers(tiny_dir):
    """The snapshot loads into torchtitan's native Qwen3 via its state-dict adapter, and the
    logits equal transformers' (same architecture, same weights)."""
    import torch
    from safetensors.torch import load_file
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
    from transformers import AutoModelForCausalLM

    from trnqwen.runtime.qwen3_native import qwen3_model_spec
    from trnqwen.titan_compat import dims_from_hf_config

    tt_tok = HuggingFaceTokenizer(tokenizer_path=str(tiny_dir))
    assert tt_tok.get_vocab_size() == tiny_model.VOCAB_SIZE
    assert tt_tok.eos_id == tiny_model.VOCAB_SIZE - 1

    # built as a run builds it: config.json's dims (titan_compat) -> the runtime's model spec
    config = json.loads((tiny_dir / "config.json").read_text())
    d = dims_from_hf_config(config)
    cfg = qwen3_model_spec(
        name="tiny", dim=d.dim, n_layers=d.n_layers, n_heads=d.n_heads, n_kv_heads=d.n_kv_heads, head_dim=d.head_dim,
        ffn_dim=d.ffn_dim, vocab_size=d.vocab_size, tied=d.tied, rope_theta=d.rope_theta,
        max_seq_len=int(config["max_position_embeddings"]), norm_eps=float(config["rms_norm_eps"]),
    ).model
    native = cfg.build()
    adapter = Qwen3StateDictAdapter(cfg, str(tiny_dir))
    state = adapter.from_hf(load_file(str(tiny_dir / tiny_model.WEIGHTS_FILE)))
    missing, unexpected = native.load_state_dict(state, strict=False)
    assert not missing and not unexpected

    ids = torch.tensor([tt_tok.encode("Dear Grace, thank you for your letter.")])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    with torch.no_grad():
        ours = native(ids, positions, native.get_attention_masks(positions))
        ref = hf(ids).logits
    assert torch.allclose(ours, ref, atol=1e-4), (ours - ref).abs().max()


def test_cli_fetch_builtin_offline_then_already_present(cli, in_tmp):
    r = cli("fetch", "builtin:tiny-qwen3", "--json")
    assert r.code == 0, r.text
    out = json.loads(r.out)
    assert out["verified"] is True and out["problems"] == []
    dest = Path(out["local_dir"])
    assert dest == in_tmp / "assets" / "hf" / "tiny-qwen3"
    assert sorted(out["files"]) == sorted(tiny_model.SNAPSHOT_FILES)
    assert out["bytes"] == sum((dest / f).stat().st_size for f in out["files"])
    first_mtime = (dest / "config.json").stat().st_mtime_ns

    again = json.loads(cli("fetch", "builtin:tiny-qwen3", "--json").out)
    assert again["verified"] and again["to_download"] == []
    assert (dest / "config.json").stat().st_mtime_ns == first_mtime  # not rewritten

    # a damaged copy is detected and written again
    (dest / "tokenizer.json").write_text("{}")
    fixed = json.loads(cli("fetch", "builtin:tiny-qwen3", "--json").out)
    assert fixed["verified"] and "tokenizer.json" in fixed["repaired"]
    assert json.loads((dest / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def test_cli_fetch_builtin_local_dir_and_unknown(cli, tmp_path):
    r = cli("fetch", "builtin:tiny-qwen3", "--local-dir", str(tmp_path / "d"), "--no-progress")
    assert r.code == 0, r.text
    assert all((tmp_path / "d" / name).is_file() for name in tiny_model.SNAPSHOT_FILES)
    bad = cli("fetch", "builtin:nope", "--local-dir", str(tmp_path / "e"))
    assert bad.code == 2 and "built-in models" in bad.err and "Traceback" not in bad.text
    assert not (tmp_path / "e").exists()
