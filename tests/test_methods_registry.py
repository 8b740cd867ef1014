"""The registry is the one list of training methods: a method registered here (an invented one,
with an invented metric) is seen by every generic reader (the model card, the data cache's kind,
eval's scorer selection, the judge, the plan, the hf-trainer hooks, the default learning rate)
with no change to those readers."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from trnqwen.methods import registry
from trnqwen.methods.base import Method, MethodPlan, Metric, load

MODULE = "tests_dummy_method"  # the invented method's modules, one in-memory module


def _module() -> types.ModuleType:
    mod = types.ModuleType(MODULE)

    def plan(cfg, assets_dir, rank_data, *, device_type, dp_degree, steps, validates):
        return MethodPlan(method="dummy", settings={"temperature": 0.5}, imports=["import math"],
                          config_lines=["config.loss = 'dummy'"], note="dummy: planned")

    def rules(facts):
        first = facts["first_step"] or {}
        return [("info", "dummy-rule", f"dummy saw step {first.get('step')}", [first.get("line")])]

    def card(eval_results, eval_dataset, num):
        return ["", "## Dummy section", *[f"- {r['checkpoint']}: wiggle {num(r.get('wiggle'))}" for r in eval_results]]

    def settings(run_config, defaults):
        return {"temperature": float((run_config or {}).get("temperature", 0.5))}

    class Hooks:
        def __init__(self, settings):
            self.settings = settings

    def table_note(method_settings):
        return f"temperature {method_settings['temperature']}"

    mod.plan, mod.rules, mod.card, mod.settings, mod.Hooks = plan, rules, card, settings, Hooks
    mod.table_note, mod.TABLE_COLUMNS = table_note, (("wiggle", "wiggle", ".3f"),)
    return mod


DUMMY = Method(
    name="dummy", help="an invented method", data="preference",
    metrics=(Metric("dummy/wiggle", "wiggle", ".3f", status=True, panel="wiggle"),),
    lr=(3e-7, "default for dummy"), lora_lr=(4e-7, "default for LoRA dummy"), token_loss=False,
    plan=f"{MODULE}:plan", hf_trainer=f"{MODULE}:Hooks", judge=f"{MODULE}:rules", eval_report=MODULE,
    card=f"{MODULE}:card",
)


@pytest.fixture
def dummy(monkeypatch):
    monkeypatch.setitem(sys.modules, MODULE, _module())
    registry.register(DUMMY)
    yield DUMMY
    registry.unregister(DUMMY.name)


def test_the_built_in_methods_and_their_declarations():
    assert registry.NAMES == ("sft", "dpo", "orpo", "grpo")
    dpo = registry.get("dpo")
    assert dpo.data == "preference" and registry.get(None).name == "sft"
    assert {m.name for m in dpo.metrics} == {"dpo/rewards_chosen", "dpo/rewards_rejected", "dpo/margin", "dpo/accuracy"}
    for method in registry.methods():  # every dotted entry point resolves
        for what in ("settings", "plan", "hf_trainer", "judge", "eval_report", "quickstart", "card"):
            if getattr(method, what):
                assert load(getattr(method, what)) is not None, (method.name, what)
    with pytest.raises(KeyError, match="sft, dpo, orpo"):
        registry.get("nope")


def test_the_config_takes_its_method_names_and_settings_from_the_registry():
    from trnqwen.config import RunConfig, default_lr

    cfg = RunConfig(method="dpo", beta=0.3, dpo_loss="ipo")
    assert (cfg.data_kind, cfg.beta, cfg.dpo_loss) == ("preference", 0.3, "ipo")
    assert RunConfig().data_kind == "chat"
    assert default_lr(cfg) == (1e-6, "default for DPO (TRL's)")
    assert RunConfig.model_fields["method"].description == registry.help_text()


def test_a_registered_method_reaches_the_readers_unchanged(dummy, tmp_path):
    from trnqwen.config import default_lr
    from trnqwen.methods.planning import plan_method

    # its learning rates
    assert default_lr(SimpleNamespace(method="dummy", lora=False, finetune=True)) == (3e-7, "default for dummy")
    assert default_lr(SimpleNamespace(method="dummy", lora=True, finetune=True))[0] == 4e-7
    # its plan (the config module's lines, the hooks' settings)
    planned = plan_method(SimpleNamespace(method="dummy"), tmp_path, None, device_type="cpu", dp_degree=1, steps=1,
                          validates=False)
    assert planned.config_lines == ["config.loss = 'dummy'"] and planned.settings == {"temperature": 0.5}
    # a cache made for another method is refused by name
    rank_data = SimpleNamespace(meta={"method": "sft"}, cache_dir=tmp_path)
    with pytest.raises(Exception, match="holds SFT rows, not data for --method dummy"):
        plan_method(SimpleNamespace(method="dummy"), tmp_path, rank_data, device_type="cpu", dp_degree=1, steps=1,
                    validates=False)


def test_the_model_card_shows_the_methods_section(dummy):
    from trnqwen.ckpt.model_folder import CardInfo, render_card

    card = render_card(CardInfo(base_model="tiny-qwen3", backend="native", method="dummy",
                                eval_results=[{"checkpoint": "base", "wiggle": 0.25}]))
    assert "## Dummy section" in card and "- base: wiggle 0.2500" in card


def test_eval_picks_the_methods_scorer_for_its_data(dummy):
    from trnqwen.evaluate.data import EvalData
    from trnqwen.evaluate.run import scoring_method

    rows = np.zeros((1, 4), dtype=np.int32)
    data = EvalData(name="d", input_ids=rows, labels=rows, positions=rows, pad_id=0, method="dummy")
    run = SimpleNamespace(record=SimpleNamespace(config={"method": "dummy", "temperature": 2}))
    assert scoring_method(data, run) == {"method": "dummy", "method_settings": {"temperature": 2.0}}
    plain = EvalData(name="d", input_ids=rows, labels=rows, positions=rows, pad_id=0)
    assert scoring_method(plain, run) == {}


def test_evals_table_is_titled_and_columned_by_what_the_method_declares(dummy, capsys):
    from trnqwen.evaluate.report import EvalReport, EvalResult, render

    report = EvalReport(dataset="d", method="dummy", method_settings={"temperature": 2.0},
                        results=[EvalResult("tuned", 10, 1.5, 4.48, preference={"pairs": 3, "preference_accuracy": 0.5,
                                                                                "margin": 0.25, "wiggle": 0.125})])
    render(report)
    out = capsys.readouterr().out
    assert "Held-out preference pairs on d (temperature 2.0)" in out and "beta" not in out, out
    assert "wiggle" in out and "0.125" in out, out


def test_the_judge_runs_the_methods_rules_and_trusts_its_loss(dummy):
    from trnqwen.logs.judge import judge
    from trnqwen.logs.engine import parse
    from trnqwen.logs.sources import RunContext
    from trnqwen.contract.stepline import format_step_line

    text = "\n".join(f"[rank0]:[titan] 2026-12-01 18:37:43,702 - root - INFO - {m}" for m in (
        "Training starts at step 1", format_step_line(1, 11.9, 1.5, 0.94, 3.98, 400, 0.0, 0.0, lr=1e-3),
        "Training completed")) + "\n"
    ctx = RunContext(vocab_size=151936, vocab_source="test", finetune=True, run_config={"method": "dummy"})
    found = {f.code: f for f in judge(parse(text), ctx)}
    assert found["dummy-rule"].message == "dummy saw step 1"
    assert "weights-not-loaded" not in found  # its loss is not the next-token loss (token_loss=False)
    sft = {f.code for f in judge(parse(text), RunContext(vocab_size=151936, vocab_source="test", finetune=True))}
    assert "weights-not-loaded" in sft and "dummy-rule" in sft  # the rules run for every log; this one always speaks


def test_the_hf_trainer_ranks_load_the_hooks_the_spec_names(dummy):
    from trnqwen.runtime.hf_trainer import load_method_hooks

    spec = SimpleNamespace(method_hooks=f"{MODULE}:Hooks", method_settings=json.dumps({"temperature": 0.5}))
    assert load_method_hooks(spec).settings == {"temperature": 0.5}
    assert load_method_hooks(SimpleNamespace(method_hooks=None, method_settings=None)) is None
    dpo = load(registry.get("dpo").hf_trainer)({"beta": 0.1, "loss_type": "sigmoid", "reference_dir": "/r"})
    assert (dpo.beta, dpo.loss_type, dpo.reference_dir) == (0.1, "sigmoid", "/r")


def test_inspect_logs_reads_a_registered_methods_own_lines(dummy):
    """A method that declares text lines (``Method.log_lines``): inspect-logs reads them into its
    own store, its step values become the steps' columns (named as its metrics), and --json's key
    of its name and its table rows come from its hooks; no logs/ module changes."""
    import dataclasses
    import io
    import re

    from rich.console import Console

    from trnqwen.contract.method_lines import LineReader, MethodLine
    from trnqwen.contract.stepline import format_step_line
    from trnqwen.logs.judge import judge
    from trnqwen.logs.engine import parse
    from trnqwen.logs.report import json_text, render
    from trnqwen.logs.sources import RunContext

    mod = sys.modules[MODULE]
    mod.READERS = (
        LineReader("dummy", re.compile(r"\[DUMMY\] step: (\d+)  wiggle: (\S+)"),
                   lambda m: MethodLine("step", {"wiggle": float(m.group(2))}, step=int(m.group(1))), ("[DUMMY]",)),
        LineReader("dummy-note", re.compile(r"\[DUMMY\] temperature (\S+)"),
                   lambda m: MethodLine("note", {"temperature": float(m.group(1))}, name="settings"), ("[DUMMY]",)),
    )
    mod.summary = lambda facts: ({"steps": len(facts["lines"]["steps"]), "notes": facts["lines"]["notes"]}
                                 if facts["lines"]["steps"] else None)
    mod.rows = lambda facts: [("dummy", f"{len(facts['lines']['steps'])} wiggles")] if facts["lines"]["steps"] else []
    registry.register(dataclasses.replace(DUMMY, log_lines=MODULE))
    msgs = ["[DUMMY] temperature 0.5"]
    for step in (1, 2):
        msgs += [format_step_line(step, 1.0, 1.5, 0.94, 3.98, 400, 0.0, 0.0, lr=1e-3), f"[DUMMY] step: {step}  wiggle: {0.25 * step}"]
    log = parse("\n".join(f"[rank0]:[titan] 2026-12-01 18:37:43,702 - root - INFO - {m}" for m in msgs) + "\n")
    assert log.method_lines["dummy"].steps[2] == {"wiggle": 0.5, "line": 5}
    data = json.loads(json_text(log, RunContext(), judge(log, RunContext())))
    assert [r["wiggle"] for r in data["steps"]] == [0.25, 0.5]
    assert data["dummy"] == {"steps": 2, "notes": {"settings": {"temperature": 0.5, "line": 1}}} and data["dpo"] is None
    con = Console(file=io.StringIO(), width=200)
    render(log, RunContext(), [], console=con)
    assert "2 wiggles" in con.file.getvalue()
