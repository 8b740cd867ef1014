"""Each setting is declared once (issue 33 #6): a RunConfig field's metadata makes its flag, its
env variable, its help, its docs row and its TOML key; a sub-model's fields (the methods' own
settings, e.g. DPO's) get all of them too."""

from __future__ import annotations

import inspect
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from trnqwen import config
from trnqwen.settings import flatten_settings, nest, setting, settings, value_of


class _Dpo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beta: float = setting(0.1, gt=0, help="DPO: strength.", flags=("--beta",), former=("beta",), panel="Method")
    loss: Literal["sigmoid", "ipo"] = setting("sigmoid", help="DPO loss.", former=("dpo_loss",), panel="Method")


class _Run(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = setting(3, ge=1, help="Training steps.")
    dpo: _Dpo = Field(default_factory=_Dpo)


def test_every_field_has_a_flag_env_help_and_panel_or_says_why_not():
    for s in config.SETTINGS:
        assert s.help and s.env == f"TRNQWEN_{s.name.upper()}" and s.panel, s.name
        assert s.flag.startswith("--") and f"Env: {s.env}" in s.flag_help
    no_flag = {s.name for s in config.SETTINGS if not s.has_flag}
    # datasets: a list of [[datasets]] tables (trnqwen.toml, or JSON in TRNQWEN_DATASETS), not one flag's value
    assert no_flag == {"lnc", "runs_dir", "compile_cache_dir", "trust_remote_code", "datasets"}


def test_train_has_one_option_per_setting_with_the_fields_help():
    """The command's signature is made from the settings: a new field is a new flag."""
    from trnqwen.cli.train import train

    params = inspect.signature(train).parameters
    for s in config.SETTINGS:
        if s.has_flag:
            option = params[s.param].annotation.__metadata__[0]
            decls = " ".join([str(option.default), *option.param_decls])  # typer keeps the first in `default`
            assert option.help == s.flag_help and s.flag in decls, s.name
    assert {"resume", "overwrite", "dry_run", "export_config", "json_out", "show_log", "submit"} <= set(params)


def test_a_sub_models_fields_are_settings_with_dotted_names():
    rows = {s.name: s for s in settings(_Run)}
    assert list(rows) == ["steps", "dpo.beta", "dpo.loss"]
    beta, loss = rows["dpo.beta"], rows["dpo.loss"]
    assert (beta.param, beta.env, beta.flag) == ("dpo__beta", "TRNQWEN_DPO__BETA", "--beta")
    assert (loss.env, loss.flag) == ("TRNQWEN_DPO__LOSS", "--dpo-loss")
    assert beta.flag_help == "DPO: strength. Env: TRNQWEN_DPO__BETA. [default: 1e-1]"
    assert nest({"dpo.beta": 0.3, "steps": 2}) == {"dpo": {"beta": 0.3}, "steps": 2}
    cfg = _Run(**nest({"dpo.beta": 0.3}))
    assert value_of(cfg, "dpo.beta") == 0.3
    former = {old: s.name for s in rows.values() for old in s.former}
    # a record from before the fields moved (flat beta, dpo_loss) reads as the sub-model's fields
    assert flatten_settings({"steps": 2, "beta": 0.2, "dpo_loss": "ipo"}, rows, former) == {
        "steps": 2, "dpo.beta": 0.2, "dpo.loss": "ipo"}
    assert flatten_settings(cfg.model_dump(), rows, former) == {"steps": 3, "dpo.beta": 0.3, "dpo.loss": "sigmoid"}


def test_a_sub_models_fields_get_flags_env_and_toml(tmp_path, monkeypatch):
    """The whole chain with a sub-model: flags through the generated signature, TRNQWEN_DPO__BETA,
    a [dpo] table and a former flat key in trnqwen.toml, sources and config show rows."""
    import typer
    from typer.testing import CliRunner

    from trnqwen.cli._options import takes_settings

    rows = settings(_Run)
    by_name = {s.name: s for s in rows}
    for name, value in {
        "RunConfig": _Run, "SETTINGS": rows, "BY_NAME": by_name, "FIELD_NAMES": tuple(by_name),
        "PATH_FIELDS": set(), "FORMER_NAMES": {o: s.name for s in rows for o in s.former},
        "ENV_NAMES": {s.env: s.name for s in rows},
    }.items():
        monkeypatch.setattr(config, name, value)
    monkeypatch.setattr(_Run, "epochs", None, raising=False)  # resolve_config's steps-or-epochs check

    (tmp_path / "trnqwen.toml").write_text('steps = 5\n[dpo]\nloss = "ipo"\n')
    r = config.resolve_config({}, environ={"TRNQWEN_DPO__BETA": "0.5"}, cwd=tmp_path)
    assert (r.config.dpo.beta, r.config.dpo.loss, r.config.steps) == (0.5, "ipo", 5)
    assert r.sources["dpo.beta"] == "env TRNQWEN_DPO__BETA" and r.sources["dpo.loss"].startswith("file ")
    assert config.flatten(r.as_dict()) == {"steps": 5, "dpo.beta": 0.5, "dpo.loss": "ipo"}  # config show's rows
    (tmp_path / "trnqwen.toml").write_text("beta = 0.25\n")  # a file from before the move
    assert config.resolve_config({}, environ={}, cwd=tmp_path).config.dpo.beta == 0.25
    assert config.resolve_config({}, environ={"TRNQWEN_BETA": "0.7"}, cwd=tmp_path).config.dpo.beta == 0.7

    seen = {}

    @takes_settings(rows=rows)
    def cmd(settings: dict = None) -> None:
        seen.update(settings)

    app = typer.Typer()
    app.command()(cmd)
    result = CliRunner().invoke(app, ["--beta", "0.3", "--dpo-loss", "ipo"])
    assert result.exit_code == 0, result.output
    assert seen == {"dpo.beta": 0.3, "dpo.loss": "ipo"}
    assert "TRNQWEN_DPO__BETA" in CliRunner().invoke(app, ["--help"]).output


@pytest.mark.parametrize("name", ["assets_dir", "time_limit", "nnodes"])
def test_the_flag_a_source_names_is_the_first_declared(name):
    assert config.flag_of(name) == {"assets_dir": "--assets", "time_limit": "--time", "nnodes": "--nnodes"}[name]
