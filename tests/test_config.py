"""The one config core: defaults < trnqwen.toml < TRNQWEN_* env < flags, with provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error
from trnqwen.config import (
    FIELD_NAMES,
    RunConfig,
    closest_field,
    model_slug,
    resolve_config,
)
from trnqwen.constants import DEFAULT_MODEL
from trnqwen.errors import EXIT_USAGE, ConfigError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- defaults and derived values ------------------------------------------------------------


def test_defaults_follow_the_recipe(tmp_path):
    r = resolve_config({}, environ={}, cwd=tmp_path)
    c = r.config
    assert c.model == DEFAULT_MODEL == "Qwen/Qwen3-4B-Instruct-2507"
    # steps and lr are None = "by what is trained": 10 steps without a dataset, torchtitan's 8e-4 from random init
    assert (c.steps, c.lr, c.local_batch_size, c.dp_shard, c.tp, c.device) == (None, None, 1, -1, 1, "auto")
    assert c.backend == "hf-v5" and c.finetune is False
    assert r.sources == {} and r.config_file is None
    assert all(row["source"].startswith("default") or row["source"] == "derived" for row in r.describe())
    rows = {row["field"]: row for row in r.describe()}
    assert (rows["steps"]["value"], rows["steps"]["source"]) == (10, "default without a dataset")
    assert rows["lr"]["value"] == 8e-4 and "random init" in rows["lr"]["source"]


def test_derived_dirs_for_the_default_model():
    c = RunConfig(finetune=True)
    assert c.resolved_assets_dir == Path("assets/hf/Qwen3-4B-Instruct-2507")
    assert c.resolved_checkpoint_dir == Path("checkpoint_qwen3_4b_ft")  # the recipe's own folder name
    assert c.resolved_export_hf is True
    plain = RunConfig()
    assert plain.resolved_checkpoint_dir == Path("checkpoint_qwen3_4b") and plain.resolved_export_hf is False
    tiny = RunConfig(model="builtin:tiny-qwen3")
    assert tiny.resolved_assets_dir == Path("assets/hf/tiny-qwen3") and tiny.is_builtin
    explicit = RunConfig(assets_dir=Path("/data/q"), checkpoint_dir=Path("/ck"), finetune=True, export_hf=False)
    assert explicit.resolved_assets_dir == Path("/data/q") and explicit.resolved_checkpoint_dir == Path("/ck")
    assert explicit.resolved_export_hf is False


@pytest.mark.parametrize(
    "model, slug",
    [
        ("Qwen/Qwen3-4B-Instruct-2507", "qwen3_4b"),
        ("Qwen/Qwen3-0.6B", "qwen3_0_6b"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3_30b_a3b"),
        ("builtin:tiny-qwen3", "tiny_qwen3"),
    ],
)
def test_model_slug(model, slug):
    assert model_slug(model) == slug


def test_default_checkpoint_folders_never_collide(tmp_path):
    """Same slug, different models -> different folders; non-ASCII names stay readable."""
    a, b = tmp_path / "x" / "model", tmp_path / "y" / "model"
    for folder in (a, b):
        _write(folder / "config.json", "{}")
    models = ["Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Base", str(a), str(b), str(tmp_path / "模型-v1"),
              str(tmp_path / "модель"), str(tmp_path / "🦙")]
    for m in models[4:]:
        _write(Path(m) / "config.json", "{}")
    dirs = [RunConfig(model=m, finetune=True).resolved_checkpoint_dir for m in models]
    assert len(set(dirs)) == len(models)
    assert model_slug(models[0]) == model_slug(models[1])  # the slug alone would have collided
    assert dirs[4].name.startswith("checkpoint_模型_v1_") and dirs[5].name.startswith("checkpoint_модель_")
    assert dirs[6].name.startswith("checkpoint_model_")  # nothing readable left: the hash tells them apart
    assert all(d.name.endswith("_ft") for d in dirs)


def test_local_model_folder_is_its_own_assets_dir(tmp_path):
    snap = tmp_path / "org" / "snap"
    _write(snap / "config.json", "{}")
    c = RunConfig(model=str(snap))
    assert c.resolved_assets_dir == snap


# --- precedence and provenance ----------------------------------------------------------------


def test_precedence_file_env_flag(tmp_path):
    _write(tmp_path / "trnqwen.toml", 'steps = 3\nbackend = "native"\nseq_len = 512\n')
    env = {"TRNQWEN_STEPS": "5", "TRNQWEN_BACKEND": "nki-moe"}

    r = resolve_config({"steps": 7}, environ=env, cwd=tmp_path)
    assert r.config.steps == 7 and r.sources["steps"] == "flag --steps"
    assert r.config.backend == "nki-moe" and r.sources["backend"] == "env TRNQWEN_BACKEND"
    assert r.config.seq_len == 512 and r.sources["seq_len"] == f"file {tmp_path / 'trnqwen.toml'}"
    assert r.config.lr == RunConfig().lr and "lr" not in r.sources

    # a source names the flag as the user typed it
    r = resolve_config({"assets_dir": tmp_path, "time_limit": "1:00:00", "nproc_per_node": 2}, environ={}, cwd=tmp_path)
    assert [r.sources[k] for k in ("assets_dir", "time_limit", "nproc_per_node")] == [
        "flag --assets", "flag --time", "flag --nproc-per-node"
    ]

    r = resolve_config({}, environ=env, cwd=tmp_path)
    assert r.config.steps == 5 and r.sources["steps"] == "env TRNQWEN_STEPS"
    r = resolve_config({}, environ={}, cwd=tmp_path)
    assert r.config.steps == 3 and r.sources["steps"].startswith("file ")
    assert r.config_file == tmp_path / "trnqwen.toml"


def test_none_flags_mean_not_given(tmp_path):
    _write(tmp_path / "trnqwen.toml", "steps = 3\n")
    r = resolve_config({"steps": None, "backend": None}, environ={}, cwd=tmp_path)
    assert r.config.steps == 3 and r.config.backend == "hf-v5"


def test_env_values_are_parsed(tmp_path):
    env = {"TRNQWEN_FINETUNE": "true", "TRNQWEN_OVERRIDE_IMPORTS": "a.b, c.d", "TRNQWEN_LR": "1e-4"}
    c = resolve_config({}, environ=env, cwd=tmp_path).config
    assert c.finetune is True and c.override_imports == ["a.b", "c.d"] and c.lr == 1e-4


def test_unknown_env_var_warns_with_suggestion(tmp_path):
    r = resolve_config({}, environ={"TRNQWEN_STPES": "4", "TRNQWEN_DEBUG": "1"}, cwd=tmp_path)
    assert r.config.steps is None  # not 4: the misspelt variable is ignored
    assert len(r.warnings) == 1 and "TRNQWEN_STEPS" in r.warnings[0]


def test_run_table_and_dashed_keys(tmp_path):
    _write(tmp_path / "trnqwen.toml", '[run]\nlocal-batch-size = 2\nmodel = "builtin:tiny-qwen3"\n')
    c = resolve_config({}, environ={}, cwd=tmp_path).config
    assert c.local_batch_size == 2 and c.model == "builtin:tiny-qwen3"


def test_path_fields_relative_to_the_toml_dir(tmp_path):
    cfg = _write(tmp_path / "project" / "conf" / "trnqwen.toml", 'assets_dir = "w/q"\ncheckpoint_dir = "/abs/ck"\n')
    r = resolve_config({}, config_file=cfg, environ={}, cwd=tmp_path)
    assert r.config.assets_dir == tmp_path / "project" / "conf" / "w" / "q"
    assert r.config.checkpoint_dir == Path("/abs/ck")
    # env and flag paths are not rewritten (they are relative to where the user runs)
    r = resolve_config({}, config_file=cfg, environ={"TRNQWEN_ASSETS_DIR": "rel"}, cwd=tmp_path)
    assert r.config.assets_dir == Path("rel")


def test_config_file_from_env(tmp_path, monkeypatch):
    cfg = _write(tmp_path / "elsewhere.toml", "steps = 9\n")
    monkeypatch.setenv("TRNQWEN_CONFIG_FILE", str(cfg))
    r = resolve_config({}, environ={}, cwd=tmp_path)
    assert r.config.steps == 9 and r.config_file == cfg


# --- errors -----------------------------------------------------------------------------------


def test_unknown_key_suggests(tmp_path):
    _write(tmp_path / "trnqwen.toml", "stpes = 3\n")
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, environ={}, cwd=tmp_path)
    assert "unknown key 'stpes'" in exc.value.message and "did you mean 'steps'" in exc.value.message
    assert exc.value.exit_code == EXIT_USAGE
    assert closest_field("seqlen") == "seq_len"
    assert closest_field("zzzzzz") is None


def test_toml_booleans_are_not_numbers(tmp_path):
    """issue 28 #8: `steps = true` became steps 1 (pydantic's lax bool -> int)."""
    _write(tmp_path / "trnqwen.toml", 'steps = true\nlr = false\nlnc = true\ncompile = true\n')
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, environ={}, cwd=tmp_path)
    problems = exc.value.problems
    assert len(problems) == 3, problems  # compile is a boolean field: accepted
    assert "steps = true: steps takes a whole number, not true/false" in problems[0]
    assert "lr = false: lr takes a number" in problems[1]
    assert "lnc = true: lnc takes a value: one of 1, 2" in problems[2]


@pytest.mark.parametrize(
    "text, again",
    [
        ("steps = 3\n[run]\nsteps = 5\n", "[run] steps sets steps again (already set by steps)"),
        ("seq_len = 64\nseq-len = 128\n", "seq-len sets seq_len again (already set by seq_len)"),
        ("[run]\nseq-len = 64\nseq_len = 64\n", "[run] seq_len sets seq_len again (already set by [run] seq-len)"),
    ],
)
def test_toml_duplicate_keys_are_refused(tmp_path, text, again):
    """issue 28 #8: a flat key and its [run] twin, or seq_len and seq-len, were resolved silently."""
    _write(tmp_path / "trnqwen.toml", text)
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, environ={}, cwd=tmp_path)
    assert again in exc.value.message and exc.value.exit_code == EXIT_USAGE


def test_toml_syntax_error(tmp_path):
    _write(tmp_path / "trnqwen.toml", "steps = = 3\n")
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, environ={}, cwd=tmp_path)
    assert "TOML syntax error" in exc.value.message and "line 1" in exc.value.message


def test_bad_values_one_line_per_field(tmp_path):
    _write(tmp_path / "trnqwen.toml", 'steps = 0\nbackend = "tpu-magic"\ndp_shard = 0\n')
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, environ={"TRNQWEN_LR": "lots"}, cwd=tmp_path)
    problems = exc.value.problems
    assert len(problems) == 4, problems
    by_field = {p.split(" ", 1)[0]: p for p in problems}
    assert set(by_field) == {"steps", "backend", "dp_shard", "lr"}
    assert "'tpu-magic'" in by_field["backend"] and "hf-v5" in by_field["backend"]
    assert ">= 1" in by_field["steps"] and "from file" in by_field["steps"]
    assert "from env TRNQWEN_LR" in by_field["lr"]


def test_cross_field_validation(tmp_path):
    with pytest.raises(ConfigError) as exc:
        resolve_config({"top_k": 9, "num_experts": 8}, environ={}, cwd=tmp_path)
    assert "top_k (9) must not exceed num_experts (8)" in exc.value.message


def test_missing_explicit_config_file(tmp_path):
    with pytest.raises(ConfigError) as exc:
        resolve_config({}, config_file=tmp_path / "nope.toml", environ={})
    assert "does not exist" in exc.value.message and exc.value.hint


# --- through the CLI --------------------------------------------------------------------------


def test_cli_bad_value_exits_2_one_line_each(cli, in_tmp):
    _write(in_tmp / "trnqwen.toml", 'steps = 0\nbackend = "tpu-magic"\n')
    r = cli("config", "show")
    assert_clean_error(r, code=2, contains="steps = 0")
    error_lines = [l for l in r.err.splitlines() if l.startswith("Error:")]
    assert len(error_lines) == 2 and any("backend" in l for l in error_lines)
    assert "->" in r.err  # the next step


def test_cli_syntax_error_exits_2(cli, in_tmp):
    _write(in_tmp / "trnqwen.toml", "[run\n")
    assert_clean_error(cli("config", "show"), code=2, contains="TOML syntax error")


def test_cli_config_show_json_sources(cli, in_tmp, monkeypatch):
    _write(in_tmp / "trnqwen.toml", "steps = 3\nfinetune = true\n")
    monkeypatch.setenv("TRNQWEN_SEQ_LEN", "256")
    r = cli("config", "show", "--json", "--backend", "native")
    assert r.code == 0, r.text
    data = json.loads(r.out)
    assert data["config"]["steps"] == 3 and data["config"]["backend"] == "native"
    assert data["sources"]["steps"].startswith("file ") and data["sources"]["backend"] == "flag --backend"
    assert data["sources"]["seq_len"] == "env TRNQWEN_SEQ_LEN" and data["sources"]["lr"] == "default for a full fine-tune"
    assert data["config"]["lr"] is None and data["derived"]["resolved_lr"] == 1e-5
    assert data["derived"]["resolved_checkpoint_dir"] == "checkpoint_qwen3_4b_ft"
    assert set(data["config"]) == set(FIELD_NAMES)


def test_cli_config_show_table(cli, in_tmp):
    r = cli("config", "show")
    assert r.code == 0 and "steps" in r.out and "default" in r.out and "no trnqwen.toml" in r.out


def test_a_bad_variable_for_train_does_not_stop_read_only_commands(cli, in_tmp, monkeypatch):
    """issue 28 #12: TRNQWEN_STEPS=abc (a train setting) stopped inspect-logs, verify-ckpt --quick, eval and data."""
    from tests.ckpt_fixtures import make_case
    from trnqwen.fetch.builtin import write_tiny_qwen3

    ckpt, assets, _ = make_case(in_tmp / "case")
    tiny = write_tiny_qwen3(in_tmp / "tiny-qwen3")
    log = in_tmp / "train.log"
    log.write_text("[rank0]:[titan] 2026-11-30 20:01:44,135 - root - INFO - step:  1  loss:  7.6395  memory:  0.94GiB(3.97%)  tps: 13\n")
    data = in_tmp / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(4)))
    monkeypatch.setenv("TRNQWEN_STEPS", "abc")
    monkeypatch.setenv("TRNQWEN_SCAN_THREADS", "2")  # used by verify-ckpt: not "not a config field"
    monkeypatch.setenv("TRNQWEN_LOG_WORKERS", "0")  # used by inspect-logs
    for args in (["inspect-logs", str(log)], ["verify-ckpt", str(ckpt), "--assets", str(assets), "--quick"],
                 ["data", str(data), "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--seq-len", "32"]):
        r = cli(*args)
        assert r.code == 0, (args, r.text)
        assert "TRNQWEN_STEPS" not in r.text and "not a config field" not in r.text, r.text
    r = cli("eval")  # no run here: its own error, not the variable's
    assert_clean_error(r, code=2, contains="no CHECKPOINT given and no previous run")
    assert "TRNQWEN_STEPS" not in r.text
    r = cli("train", "--model", "builtin:tiny-qwen3", "--dry-run")  # train uses it: refused, naming it
    assert_clean_error(r, code=2, contains="from env TRNQWEN_STEPS")


def test_every_trnqwen_variable_the_code_reads_is_a_field_or_reserved():
    """issue 28 #12: TRNQWEN_SCAN_THREADS and TRNQWEN_LOG_WORKERS were read, and warned about as "not a config field"."""
    import re

    from tests.helpers import REPO_ROOT
    from trnqwen.config import ENV_PREFIX, RESERVED_ENV

    named = set()
    for path in (REPO_ROOT / "trnqwen").rglob("*.py"):
        if path.name != "_help_text.py":
            named |= set(re.findall(r"[\"'](TRNQWEN_[A-Z0-9_]+)[\"']", path.read_text()))
    assert {"TRNQWEN_SCAN_THREADS", "TRNQWEN_LOG_WORKERS"} <= named
    unknown = {n for n in named if n not in RESERVED_ENV and n[len(ENV_PREFIX):].lower() not in FIELD_NAMES}
    assert not unknown, sorted(unknown)
