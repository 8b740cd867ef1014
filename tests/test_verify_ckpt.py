"""verify-ckpt on tiny real checkpoints: good ones pass, each kind of damage fails with the right
finding and exit code, bad input gets one clean line, and nothing is ever modified."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ckpt_fixtures import copy_case, make_case, tree_hash, write_export
from tests.helpers import REPO_ROOT, assert_clean_error


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One good tied tiny export (with tokenizer), copied by each test that changes it."""
    root = tmp_path_factory.mktemp("vc_base")
    ckpt, assets, state = make_case(root, tied=True, tokenizer=True)
    return root, state


@pytest.fixture
def case(base, tmp_path):
    root, state = base
    dst = copy_case(root, tmp_path / "case")
    return dst / "ckpt", dst / "assets", state


def verify_json(cli, *args):
    res = cli("verify-ckpt", *map(str, args), "--json")
    doc = json.loads(res.out)
    return res, doc


def step_dir(ckpt: Path) -> Path:
    return next(ckpt.glob("step-*"))


def rewrite(ckpt: Path, state: dict, **kw) -> None:
    sd = step_dir(ckpt)
    shutil.rmtree(sd)
    write_export(sd, state, **kw)


# --- the good case ---------------------------------------------------------------------------


def test_ok_tied_only_lm_head_expected_missing(cli, case):
    ckpt, assets, state = case
    before = tree_hash(ckpt)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 0, res.text
    assert doc["ok"] is True
    assert doc["missing_keys"] == [] and doc["unexpected_keys"] == [] and doc["mismatched"] == []
    assert doc["expected_missing"] == ["lm_head.weight"]
    assert doc["nonfinite"] == {} and doc["scanned"] is True
    assert doc["num_tensors"] == len(state)
    assert doc["num_parameters"] == sum(t.numel() for t in state.values())
    assert [f["name"] for f in doc["files"]] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert doc["step"] == 3
    assert tree_hash(ckpt) == before


def test_human_summary_and_config_found_beside_checkpoint(cli, case):
    ckpt, assets, _ = case
    shutil.copy(assets / "config.json", ckpt / "config.json")  # beside the checkpoint folder
    res = cli("verify-ckpt", str(ckpt))
    assert res.code == 0, res.text
    assert "OK" in res.out and "lm_head.weight" in res.out and "beside the checkpoint" in res.out
    assert "Traceback" not in res.text


def test_untied_model_with_head_is_ok_and_without_it_fails(cli, tmp_path):
    ckpt, assets, state = make_case(tmp_path / "untied", tied=False)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 0 and doc["expected_missing"] == [], res.text
    state.pop("lm_head.weight")
    rewrite(ckpt, state)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    assert doc["missing_keys"] == ["lm_head.weight"] and doc["expected_missing"] == []
    assert "missing key" in res.err and "Traceback" not in res.text


# --- damaged checkpoints ----------------------------------------------------------------------


def test_one_tensor_removed(cli, case):
    ckpt, assets, state = case
    victim = "model.layers.1.mlp.up_proj.weight"
    rewrite(ckpt, {k: v for k, v in state.items() if k != victim})
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    assert doc["ok"] is False and doc["missing_keys"] == [victim]
    assert doc["expected_missing"] == ["lm_head.weight"]


def test_wrong_shape(cli, case):
    import torch

    ckpt, assets, state = case
    victim = "model.layers.0.self_attn.k_proj.weight"
    bad = dict(state)
    bad[victim] = torch.zeros(state[victim].shape[0] + 8, state[victim].shape[1], dtype=state[victim].dtype)
    rewrite(ckpt, bad)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    shape = [m for m in doc["mismatched"] if m["kind"] == "shape"]
    assert [m["key"] for m in shape] == [victim]
    assert shape[0]["found"] == list(bad[victim].shape) and shape[0]["expected"] == list(state[victim].shape)
    assert doc["missing_keys"] == []


def test_nan_and_inf_counted_per_tensor(cli, case):
    import torch

    ckpt, assets, state = case
    victim = "model.layers.1.self_attn.o_proj.weight"
    bad = dict(state)
    t = state[victim].clone()
    flat = t.view(-1)
    flat[[0, 5, 17]] = float("nan")
    flat[[100, 101]] = float("inf")
    flat[-1] = float("-inf")
    bad[victim] = t
    rewrite(ckpt, bad)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    assert doc["nonfinite"] == {victim: int((~torch.isfinite(t.float())).sum())}
    assert doc["nonfinite_detail"][victim] == {"nan": int(t.float().isnan().sum()), "inf": int(t.float().isinf().sum())}
    assert "NaN/Inf" in res.err
    # --quick reads headers only: the same checkpoint passes, saying the values were not scanned
    res, doc = verify_json(cli, ckpt, "--assets", assets, "--quick")
    assert res.code == 0 and doc["scanned"] is False and doc["nonfinite"] == {}


def test_truncated_shard(cli, case):
    ckpt, assets, _ = case
    shard = step_dir(ckpt) / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    before = tree_hash(ckpt)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    assert "truncated" in doc["file_errors"]["model-00002-of-00002.safetensors"]
    assert_clean_error(res, code=1, contains="truncated")
    assert tree_hash(ckpt) == before


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda b: b"\xff" * 8 + b[8:], "bad header"),
        (lambda b: b[:8] + b"[" + b[9:], "bad header"),
        (lambda b: b[:5], "truncated"),
        (lambda b: b + b"\0" * 16, "unexpected bytes"),
        (lambda b: b"", "truncated"),
    ],
)
def test_corrupt_shard_one_clean_line(cli, case, damage, words):
    ckpt, assets, _ = case
    shard = step_dir(ckpt) / "model-00001-of-00002.safetensors"
    shard.write_bytes(damage(shard.read_bytes()))
    before = tree_hash(ckpt)
    res = cli("verify-ckpt", str(ckpt), "--assets", str(assets))
    assert_clean_error(res, code=1, contains=words)
    assert res.err.count("Error:") == 1
    assert tree_hash(ckpt) == before


class _Boom:
    """Unpickling this creates a marker file: proof that verify-ckpt never unpickles."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_pickle_only_folder_refused_never_unpickled(cli, tmp_path, case):
    _, assets, _ = case
    folder = tmp_path / "pickles"
    folder.mkdir()
    marker = tmp_path / "UNPICKLED"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Boom(str(marker))}))
    shutil.copy(assets / "config.json", folder / "config.json")
    before = tree_hash(folder)
    res = cli("verify-ckpt", str(folder))
    assert_clean_error(res, code=1, contains="pickle")
    assert "safetensors" in res.err and "save_file" in res.err  # says how to convert
    assert not marker.exists()
    res = cli("verify-ckpt", str(folder / "pytorch_model.bin"), "--json")
    assert_clean_error(res, code=1, contains="pickle")
    assert not marker.exists() and tree_hash(folder) == before


def test_index_cross_check(cli, case):
    ckpt, assets, _ = case
    index_path = step_dir(ckpt) / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    moved = "model.norm.weight"
    index["weight_map"][moved] = "model-00001-of-00002.safetensors" if index["weight_map"][moved].endswith("2.safetensors") else "model-00002-of-00002.safetensors"
    index["weight_map"]["model.ghost.weight"] = "model-00003-of-00003.safetensors"
    stray = sorted(index["weight_map"])[0]
    del index["weight_map"][stray]
    index_path.write_text(json.dumps(index))
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    text = "\n".join(doc["index_problems"])
    assert "model-00003-of-00003.safetensors" in text and "absent" in text
    assert f"says {moved} is in" in text
    assert stray in text and "does not list" in text


def test_a_self_linked_shard_is_named_as_such_not_absent(cli, case):
    """issue 28 #12: a shard that is a symbolic link to itself was reported as "absent"."""
    ckpt, assets, _ = case
    shard = step_dir(ckpt) / "model-00002-of-00002.safetensors"
    shard.unlink()
    shard.symlink_to(shard.name)
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 1
    text = "\n".join(doc["index_problems"])
    assert "lists model-00002-of-00002.safetensors" in text and "but it is a symbolic link to itself" in text, text
    assert "absent" not in text


def test_float32_export_of_bf16_config_loads_with_a_note(cli, case):
    ckpt, assets, state = case
    rewrite(ckpt, {k: v.float() for k, v in state.items()})
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 0, res.text
    assert {m["kind"] for m in doc["mismatched"]} == {"dtype"}
    assert all(m["fatal"] is False and m["found"] == "F32" and m["expected"] == "BF16" for m in doc["mismatched"])
    assert len(doc["mismatched"]) == len(state)


def test_checkpoint_of_another_size_than_config(cli, tmp_path, case):
    _, assets, _ = case
    other, _, _ = make_case(tmp_path / "bigger", tied=True, num_hidden_layers=3, hidden_size=48)
    res, doc = verify_json(cli, other, "--assets", assets)
    assert res.code == 1
    assert "another model size" in doc["diagnosis"]
    assert "layers 3" in doc["diagnosis"] and "hidden 48" in doc["diagnosis"]
    res = cli("verify-ckpt", str(other), "--assets", str(assets))
    assert_clean_error(res, code=1, contains="another model size")
    assert len(res.out.splitlines()) < 60  # findings are capped, not hundreds of lines


# --- usage errors ---------------------------------------------------------------------------


def test_usage_errors(cli, tmp_path, case):
    ckpt, assets, _ = case
    assert_clean_error(cli("verify-ckpt", str(tmp_path / "nope")), code=2, contains="no such path")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clean_error(cli("verify-ckpt", str(empty)), code=2, contains="empty")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hi")
    assert_clean_error(cli("verify-ckpt", str(junk)), code=2, contains="no checkpoint")
    # no config.json anywhere (the assets are not beside this checkpoint)
    lone = tmp_path / "lone"
    shutil.copytree(ckpt, lone / "ckpt")
    assert_clean_error(cli("verify-ckpt", str(lone / "ckpt")), code=2, contains="config.json")
    assert_clean_error(cli("verify-ckpt", str(ckpt), "--assets", str(empty)), code=2, contains="config.json")
    assert_clean_error(cli("verify-ckpt", str(ckpt), "--assets", str(assets), "--step", "9"), code=2, contains="step-9")


def test_non_qwen3_config(cli, tmp_path, case):
    ckpt, assets, _ = case
    llama = tmp_path / "llama"
    llama.mkdir()
    cfg = json.loads((assets / "config.json").read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (llama / "config.json").write_text(json.dumps(cfg))
    res = cli("verify-ckpt", str(ckpt), "--assets", str(llama))
    assert_clean_error(res, code=2, contains="not a Qwen3")


def test_step_selection_and_dcp_only(cli, case):
    ckpt, assets, state = case
    write_export(ckpt / "step-10", state)
    dcp = ckpt / "step-20"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"x")
    (dcp / "__0_0.distcp").write_bytes(b"x")
    res, doc = verify_json(cli, ckpt, "--assets", assets)
    assert res.code == 0 and doc["step"] == 10  # the last step with HF safetensors
    res, doc = verify_json(cli, ckpt, "--assets", assets, "--step", "3")
    assert res.code == 0 and doc["step"] == 3
    res, doc = verify_json(cli, step_dir(ckpt).parent / "step-10", "--assets", assets)
    assert res.code == 0 and doc["step"] == 10
    assert_clean_error(cli("verify-ckpt", str(ckpt), "--assets", str(assets), "--step", "20"), code=1, contains="DCP")
    shutil.rmtree(ckpt / "step-3")
    shutil.rmtree(ckpt / "step-10")
    assert_clean_error(cli("verify-ckpt", str(ckpt), "--assets", str(assets)), code=1, contains="DCP")


def test_a_trainer_resume_point_is_named_and_the_export_suggested(cli, tmp_path):
    """hf-trainer's resume/checkpoint-N (DCP model + optimizer, pickled scheduler and RNG) is not an
    export: say what it is and which folder to verify, not "pickle files"."""
    point = tmp_path / "ck" / "resume" / "checkpoint-4"
    (point / "dcp").mkdir(parents=True)
    (point / "dcp" / ".metadata").write_bytes(b"x")
    for name in ("scheduler.pt", "rng_state_0.pth"):
        (point / name).write_bytes(b"x")
    (point / "trainer_state.json").write_text("{}")
    res = cli("verify-ckpt", str(point))
    assert_clean_error(res, code=1, contains="is a resumable Trainer checkpoint")
    assert f"trnqwen verify-ckpt {tmp_path / 'ck'}" in res.text


def test_default_is_the_last_runs_checkpoint(cli, case, tmp_path, monkeypatch):
    from trnqwen.rundir import RunRecord, next_run_id, point_last

    ckpt, assets, _ = case
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert_clean_error(cli("verify-ckpt"), code=2, contains="no previous run")
    runs = Path(".trnqwen/runs")
    run_id = next_run_id(runs, "hf-v5", method="sft", lora=False)
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    point_last(runs, run_id)  # what trnqwen train does once the run dir exists
    RunRecord(run_id=run_id, run_dir=str(run_dir), status="succeeded", checkpoint_dir=str(ckpt), assets_dir=str(assets)).save()
    res, doc = verify_json(cli)
    assert res.code == 0, res.text
    assert doc["checkpoint"] == str(step_dir(ckpt)) and doc["config_source"] == "the run record's assets"


# --- beyond the recipe ---------------------------------------------------------------------


def test_compare_to_reports_relative_change(cli, case, tmp_path):
    import torch

    ckpt, assets, state = case
    ref = tmp_path / "ref"
    shutil.copytree(ckpt, ref)
    moved, blown = "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.gate_proj.weight"
    tuned = dict(state)
    torch.manual_seed(1)
    tuned[moved] = (state[moved].float() + 0.01 * torch.randn_like(state[moved].float())).to(state[moved].dtype)
    tuned[blown] = (state[blown].float() * 5).to(state[blown].dtype)
    rewrite(ckpt, tuned)
    res, doc = verify_json(cli, ckpt, "--assets", assets, "--compare-to", ref)
    assert res.code == 1  # the blown-up tensor
    c = doc["compare"]
    for name in (moved, blown):
        want = float((tuned[name].double() - state[name].double()).norm() / state[name].double().norm())
        assert c["rel_change"][name] == pytest.approx(want, rel=1e-6)
    assert c["rel_change"][blown] == pytest.approx(4.0, rel=1e-3)
    assert c["exploded"] == [blown]
    assert set(c["unchanged"]) == set(state) - {moved, blown}
    assert c["compared"] == len(state)
    # identical weights: fine-tuning did not move anything -> a failed check
    res, doc = verify_json(cli, ref, "--assets", assets, "--compare-to", ref)
    assert res.code == 1 and "did not move" in " ".join(doc["problems"])


def test_generate_greedy_on_cpu(cli, case):
    ckpt, assets, _ = case
    res, doc = verify_json(cli, ckpt, "--assets", assets, "--generate", "Hello", "--max-new-tokens", "5", "--device", "cpu")
    assert res.code == 0, res.text
    g = doc["generate"]
    assert g["error"] is None and g["device"] == "cpu" and g["device_map"] is None
    assert len(g["new_tokens"]) == 5
    # greedy: the same tokens as running the model by hand
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from safetensors.torch import load_file

    tok = AutoTokenizer.from_pretrained(str(assets))
    from transformers import AutoConfig

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(assets)), dtype=torch.bfloat16)
    for f in sorted(step_dir(ckpt).glob("*.safetensors")):
        model.load_state_dict(load_file(str(f)), strict=False)
    model.tie_weights()
    ids = tok("Hello", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        for _ in range(5):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert g["new_tokens"] == ids[0, -5:].tolist()
    # a lone shard file (no index): the shard-by-shard path gives the same tokens
    lone = step_dir(ckpt) / "model-00001-of-00002.safetensors"
    merged = lone.parent.parent / "single"
    merged.mkdir()
    from safetensors.torch import save_file

    both = {}
    for f in sorted(step_dir(ckpt).glob("*.safetensors")):
        both.update(load_file(str(f)))
    save_file(both, str(merged / "weights.safetensors"))
    res, doc = verify_json(cli, merged / "weights.safetensors", "--assets", assets, "--generate", "Hello", "--max-new-tokens", "5", "--device", "cpu")
    assert res.code == 0, res.text
    assert doc["generate"]["new_tokens"] == g["new_tokens"]


def test_device_map_choice():
    from trnqwen.ckpt.generate import device_map_for, detect_device_type

    assert device_map_for("neuron") == "neuron"  # "auto" would not see Neuron
    assert device_map_for("cuda") == "cuda"
    assert device_map_for("cpu") is None
    assert detect_device_type("cpu") == "cpu"


def test_round_trip_flag_agrees_with_header_check(cli, case):
    ckpt, assets, state = case
    victim = "model.layers.0.mlp.up_proj.weight"
    rewrite(ckpt, {k: v for k, v in state.items() if k != victim} | {"model.extra.weight": state[victim]})
    res, doc = verify_json(cli, ckpt, "--assets", assets, "--round-trip", "--quick")
    assert res.code == 1
    rt = doc["round_trip"]
    assert rt["disagrees"] is None and rt["model_class"] == "Qwen3ForCausalLM"
    assert rt["missing_keys"] == sorted([victim, "lm_head.weight"]) and rt["unexpected_keys"] == ["model.extra.weight"]


def test_cli_module_imports_no_numpy_or_torch():
    code = "import sys, trnqwen.cli.main, trnqwen.ckpt; print(sorted(m for m in ('numpy', 'torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_flags(cli):
    res = cli("verify-ckpt", "--help")
    assert res.code == 0
    for flag in ("--step", "--quick", "--compare-to", "--generate", "--round-trip", "--json", "--assets"):
        assert flag in res.out
