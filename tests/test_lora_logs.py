"""inspect-logs reads the [LoRA] line (trnqwen.contract.lora.log_line) and judges it: a run that trains
only its adapters is reported, one whose trainable count is not the adapters' is an error, and a
LoRA run without the line is a warning."""

from __future__ import annotations

import json

from tests.lora_fixtures import ALL, make_base
from trnqwen.logs.judge import judge
from trnqwen.adapters.lora.readers import lora_json
from trnqwen.logs.engine import parse
from trnqwen.logs.sources import RunContext
from trnqwen.contract.stepline import format_step_line
from trnqwen.contract.lora import LoraSpec, log_line

SPEC = LoraSpec(rank=8, alpha=16.0, dropout=0.0, targets=ALL, seed=0, base_model="m")
# tests.lora_fixtures' base: 2 layers, hidden 32, 4 heads x 8, 2 kv heads, ffn 64 -> r x (in + out) summed
ADAPTER_PARAMS = 2 * 8 * ((32 + 32) + (32 + 16) * 2 + (32 + 32) + (32 + 64) * 2 + (64 + 32))
BASE_PARAMS = 96 * 32 + 2 * (32 * 32 * 2 + 16 * 32 * 2 + 3 * 32 * 64 + 8 * 2 + 32 * 2) + 32


def titan(rank, msg, level="INFO"):
    return f"[rank{rank}]:[titan] 2026-12-01 10:00:00,000 - root - {level} - {msg}"


def make_log(ranks=2, *, lines=None, steps=3) -> str:
    """A LoRA run's log: every rank's [LoRA] line (``lines``: rank -> log_line kwargs), then steps."""
    out = []
    for r in range(ranks):
        kw = dict(trainable=ADAPTER_PARAMS, total=BASE_PARAMS + ADAPTER_PARAMS, spec=SPEC, adapters=14, initialised=14, rank=r)
        kw.update((lines or {}).get(r, {}))
        if kw.pop("skip", False):
            continue
        out.append(titan(r, log_line(**kw)))
    for s in range(1, steps + 1):
        for r in range(ranks):
            out.append(titan(r, format_step_line(s, 3.0 - s / 10, 1.0, 1.0, 10.0, 100, 1.0, None)))
    out.append(titan(0, "Training completed"))
    return "\n".join(out) + "\n"


def ctx_for(tmp_path, lora=True, **cfg) -> RunContext:
    base = make_base(tmp_path / "base")
    ctx = RunContext(model_config=json.loads((base / "config.json").read_text()))
    if lora:
        ctx.lora = {"rank": 8, "alpha": 16.0, "targets": list(ALL), "backend": "native", **cfg}
    return ctx


def codes(findings, severity=None):
    return {f.code for f in findings if severity is None or f.severity == severity}


def test_the_line_is_parsed_per_rank():
    log = parse(make_log(2, lines={1: dict(trainable=7)}))
    assert sorted(log.lora) == [0, 1]
    rec = log.lora[0]
    assert rec["trainable"] == ADAPTER_PARAMS and rec["total"] == BASE_PARAMS + ADAPTER_PARAMS
    assert rec["rank"] == 8 and rec["alpha"] == 16.0 and rec["adapters"] == 14 and rec["initialised"] == 14
    assert rec["targets"] == list(ALL) and rec["line"] == 1
    assert log.lora[1]["trainable"] == 7


def test_unprefixed_line_takes_its_own_rank():
    line = log_line(trainable=5, total=50, spec=SPEC, adapters=14, initialised=14, rank=3)
    log = parse(f"[titan] 2026-12-01 10:00:00,000 - root - INFO - {line}\n")
    assert list(log.lora) == [3]


def test_adapters_only_is_reported(tmp_path):
    log = parse(make_log(2))
    ctx = ctx_for(tmp_path)
    findings = judge(log, ctx)
    assert not codes(findings, "error") & {"lora-not-adapters", "lora-ranks-disagree", "lora-config-mismatch"}
    info = next(f for f in findings if f.code == "lora")
    assert f"{ADAPTER_PARAMS:,} trainable" in info.message and "as config.json's shapes give" in info.message
    doc = lora_json(log, ctx)
    assert doc["logged"] and doc["ranks"] == [0, 1] and doc["expected_trainable"] == ADAPTER_PARAMS
    assert doc["trainable"] == ADAPTER_PARAMS and doc["configured"]["rank"] == 8


def test_whole_model_trainable_is_an_error(tmp_path):
    total = BASE_PARAMS + ADAPTER_PARAMS
    log = parse(make_log(2, lines={0: dict(trainable=total), 1: dict(trainable=total)}))
    findings = judge(log, ctx_for(tmp_path))
    err = next(f for f in findings if f.code == "lora-not-adapters")
    assert err.severity == "error" and "every parameter is trainable" in err.message and err.lines == [1]


def test_count_not_the_adapters_is_an_error(tmp_path):
    """Base norms left trainable: more than the adapters, less than everything."""
    n = ADAPTER_PARAMS + 4 * 32
    log = parse(make_log(1, lines={0: dict(trainable=n)}))
    err = next(f for f in judge(log, ctx_for(tmp_path)) if f.code == "lora-not-adapters")
    assert f"{n:,} trainable" in err.message and f"{ADAPTER_PARAMS:,} parameters" in err.message


def test_uninitialised_adapters_are_an_error(tmp_path):
    log = parse(make_log(1, lines={0: dict(initialised=10)}))
    err = next(f for f in judge(log, ctx_for(tmp_path)) if f.code == "lora-not-adapters")
    assert "10 of 14 adapters were initialised" in err.message


def test_ranks_disagree_is_an_error(tmp_path):
    log = parse(make_log(2, lines={1: dict(trainable=ADAPTER_PARAMS + 64)}))
    err = next(f for f in judge(log, ctx_for(tmp_path)) if f.code == "lora-ranks-disagree")
    assert err.severity == "error" and "trainable" in err.message and err.lines == [1, 2]


def test_line_not_the_run_config_is_an_error(tmp_path):
    log = parse(make_log(1))
    err = next(f for f in judge(log, ctx_for(tmp_path, rank=16)) if f.code == "lora-config-mismatch")
    assert "rank 8 logged, 16 configured" in err.message


def test_lora_run_without_the_line_warns(tmp_path):
    log = parse(make_log(2, lines={0: dict(skip=True), 1: dict(skip=True)}))
    findings = judge(log, ctx_for(tmp_path))
    warn = next(f for f in findings if f.code == "lora-line-missing")
    assert warn.severity == "warning"
    assert lora_json(log, ctx_for(tmp_path)) == {"logged": False, "configured": ctx_for(tmp_path).lora}
    # not a LoRA run: nothing said
    plain = judge(log, ctx_for(tmp_path, lora=False))
    assert not {c for c in codes(plain) if c.startswith("lora")}
    assert lora_json(log, ctx_for(tmp_path, lora=False)) is None


def _run_dir(tmp_path, text: str, *, lora: bool, rank_files: dict | None = None):
    """A run dir; ``rank_files``: rank -> the text of its tee'd torchrun log (ranks/<id>/attempt_0/<r>/stdout.log)."""
    from trnqwen.rundir import RunRecord

    base = make_base(tmp_path / "assets")
    d = tmp_path / "runs" / "r1"
    d.mkdir(parents=True)
    (d / "train.log").write_text(text)
    for r, body in (rank_files or {}).items():
        f = d / "ranks" / "none_x" / "attempt_0" / str(r) / "stdout.log"
        f.parent.mkdir(parents=True)
        f.write_text(body)
    config = {"steps": 3, "finetune": True, "model": "builtin:tiny-qwen3", "backend": "native", "lora": lora,
              "lora_rank": 8, "lora_alpha": None, "lora_targets": "all-linear"}
    RunRecord(run_id="r1", run_dir=str(d), status="succeeded", config=config, log_path=str(d / "train.log"),
              assets_dir=str(base), backend="native", steps=3, ended_by="completed",
              extra={"rank_log_dir": str(d / "ranks")}).save()
    return d


def test_cli_table_and_json(cli, tmp_path):
    d = _run_dir(tmp_path, make_log(2), lora=True)
    res = cli("inspect-logs", str(d), "--json")
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    assert doc["lora"]["trainable"] == ADAPTER_PARAMS and doc["lora"]["expected_trainable"] == ADAPTER_PARAMS
    assert doc["lora"]["configured"] == {"rank": 8, "alpha": 16.0, "targets": list(ALL), "backend": "native"}
    res = cli("inspect-logs", str(d))
    assert res.code == 0 and "LoRA" in res.out and f"trainable {ADAPTER_PARAMS:,} of" in res.out


def test_cli_fails_a_run_training_more_than_its_adapters(cli, tmp_path):
    total = BASE_PARAMS + ADAPTER_PARAMS
    d = _run_dir(tmp_path, make_log(2, lines={0: dict(trainable=total), 1: dict(trainable=total)}), lora=True)
    res = cli("inspect-logs", str(d), "--json")
    assert res.code == 1, res.text
    assert "lora-not-adapters" in {f["code"] for f in json.loads(res.out)["findings"]}


def test_cli_warns_when_the_line_is_missing(cli, tmp_path):
    d = _run_dir(tmp_path, make_log(2, lines={0: dict(skip=True), 1: dict(skip=True)}), lora=True)
    res = cli("inspect-logs", str(d), "--json")
    doc = json.loads(res.out)
    assert "lora-line-missing" in {f["code"] for f in doc["findings"] if f["severity"] == "warning"}
    assert doc["lora"]["logged"] is False


def _rank_file(r: int, **kw) -> str:
    args = dict(trainable=ADAPTER_PARAMS, total=BASE_PARAMS + ADAPTER_PARAMS, spec=SPEC, adapters=14, initialised=14, rank=r)
    args.update(kw)
    return f"[titan] 2026-12-01 10:00:00,000 - root - INFO - {log_line(**args)}\nother output\n"


def test_cli_reads_every_ranks_line_from_the_per_rank_logs(cli, tmp_path):
    """train.log holds rank 0's output only (torchrun --local-ranks-filter 0): the other ranks' lines
    are in the run's per-rank logs."""
    d = _run_dir(tmp_path, make_log(1), lora=True, rank_files={0: _rank_file(0), 1: _rank_file(1)})
    res = cli("inspect-logs", str(d), "--json")
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    assert doc["lora"]["ranks"] == [0, 1]
    assert "2 rank(s) logged it" in next(f["message"] for f in doc["findings"] if f["code"] == "lora")


def test_cli_fails_when_another_rank_trains_more(cli, tmp_path):
    files = {0: _rank_file(0), 1: _rank_file(1, trainable=BASE_PARAMS + ADAPTER_PARAMS)}
    d = _run_dir(tmp_path, make_log(1), lora=True, rank_files=files)
    res = cli("inspect-logs", str(d), "--json")
    assert res.code == 1, res.text
    err = next(f for f in json.loads(res.out)["findings"] if f["code"] == "lora-ranks-disagree")
    assert "rank 1: trainable" in err["message"]
