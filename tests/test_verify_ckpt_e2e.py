"""verify-ckpt on a REAL export: ``trnqwen train --finetune`` on CPU (2 ranks, torchrun,
torchtitan hf-v5, 2 steps) writes ``checkpoint_tiny_qwen3_<hash>_ft/hf/step-2``; that passes with only the
tied ``lm_head.weight`` missing, and copies damaged each way fail with the right finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.ckpt_fixtures import tree_hash
from tests.helpers import assert_clean_error, run_subprocess
from trnqwen.config import RunConfig

CKPT = str(RunConfig(model="builtin:tiny-qwen3", finetune=True).resolved_checkpoint_dir)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("vc_e2e")
    env = {"HF_HUB_OFFLINE": "1"}
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", cwd=work, env=env, timeout=300)
    assert fetched.code == 0, fetched.text
    run = run_subprocess(
        "train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "2",
        "--steps", "2", "--seq-len", "128", "--finetune", cwd=work, env=env, timeout=900,
    )
    assert run.code == 0, run.text[-4000:]
    ckpt = work / CKPT
    assert (ckpt / "hf" / "step-2" / "model.safetensors.index.json").is_file(), run.text[-2000:]
    return work, ckpt, work / "assets" / "hf" / "tiny-qwen3"


def _json(res):
    return json.loads(res.out)


def test_real_export_verifies_with_only_tied_head_missing(trained, monkeypatch, cli):
    work, ckpt, assets = trained
    before = tree_hash(ckpt)
    monkeypatch.chdir(work)  # no CHECKPOINT: the last run's checkpoint and assets
    res = cli("verify-ckpt", "--json", "--round-trip", "--compare-to", str(assets))
    assert res.code == 0, res.text
    doc = _json(res)
    assert doc["ok"] and doc["step"] == 2 and doc["scanned"]
    assert doc["expected_missing"] == ["lm_head.weight"]
    assert doc["missing_keys"] == [] and doc["unexpected_keys"] == [] and doc["nonfinite"] == {}
    assert [m for m in doc["mismatched"] if m["fatal"]] == []
    assert doc["round_trip"]["missing_keys"] == ["lm_head.weight"] and doc["round_trip"]["disagrees"] is None
    c = doc["compare"]  # fine-tuning moved every tensor, a little
    assert c["compared"] == doc["num_tensors"] and c["unchanged"] == [] and c["exploded"] == []
    assert 0 < c["max_rel_change"] < 1
    assert tree_hash(ckpt) == before


def test_explicit_checkpoint_path_finds_the_assets_of_the_run_that_wrote_it(trained, monkeypatch, cli):
    """As users type it: `trnqwen verify-ckpt ./checkpoint_tiny_qwen3_<hash>_ft`, no --assets."""
    work, ckpt, _ = trained
    monkeypatch.chdir(work)
    for given in (CKPT, f"{CKPT}/hf", f"{CKPT}/hf/step-2"):
        res = cli("verify-ckpt", given, "--quick", "--json")
        assert res.code == 0, res.text
        assert _json(res)["expected_missing"] == ["lm_head.weight"]


def _damaged(ckpt: Path, dst: Path, edit) -> Path:
    from safetensors.torch import load_file

    copy = shutil.copytree(ckpt / "hf" / "step-2", dst / "step-2")
    shard = next(copy.glob("model-*.safetensors"))
    state = load_file(str(shard))
    edit(state, shard)
    return dst


def test_damaged_copies_of_the_real_export_fail(trained, tmp_path, cli):
    import torch
    from safetensors.torch import save_file

    _, ckpt, assets = trained
    victim = "model.layers.1.mlp.down_proj.weight"

    def drop(state, shard):
        state.pop(victim)
        save_file(state, str(shard))
        index = shard.parent / "model.safetensors.index.json"
        doc = json.loads(index.read_text())
        del doc["weight_map"][victim]
        doc["metadata"]["total_size"] = sum(t.numel() * t.element_size() for t in state.values())
        index.write_text(json.dumps(doc))

    def reshape(state, shard):
        state[victim] = torch.zeros(3, 7)
        save_file(state, str(shard))

    def nan(state, shard):
        state[victim] = state[victim].clone()
        state[victim].view(-1)[:4] = float("nan")
        save_file(state, str(shard))

    def truncate(state, shard):
        shard.write_bytes(shard.read_bytes()[:-1000])

    cases = {
        "removed": (drop, lambda d: d["missing_keys"] == [victim]),
        "shape": (reshape, lambda d: [m["key"] for m in d["mismatched"] if m["kind"] == "shape"] == [victim]),
        "nan": (nan, lambda d: d["nonfinite"] == {victim: 4}),
        "truncated": (truncate, lambda d: "truncated" in next(iter(d["file_errors"].values()))),
    }
    for name, (edit, finding) in cases.items():
        folder = _damaged(ckpt, tmp_path / name, edit)
        before = tree_hash(folder)
        res = cli("verify-ckpt", str(folder), "--assets", str(assets), "--json")
        assert res.code == 1, (name, res.text)
        assert finding(_json(res)), (name, res.out)
        assert "Traceback" not in res.text
        assert tree_hash(folder) == before

    # the same weights as a pickle: refused, never unpickled
    pick = tmp_path / "pickled"
    pick.mkdir()
    from safetensors.torch import load_file

    torch.save(load_file(str(next((ckpt / "hf" / "step-2").glob("model-*.safetensors")))), pick / "pytorch_model.bin")
    before = tree_hash(pick)
    res = cli("verify-ckpt", str(pick), "--assets", str(assets))
    assert_clean_error(res, code=1, contains="pickle")
    assert tree_hash(pick) == before
