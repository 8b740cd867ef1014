"""The [OverrideCalls] line: its one format, how inspect-logs reads it into --json
(overrides[<name>].calls / .fallbacks), and the judge's rules: an override that never ran or
fell back on every call is an error, some fallbacks a warning, an applied override that
reports nothing is not healthy either."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_subprocess
from trnqwen.contract.override_calls import format_calls_line, parse_calls_line
from trnqwen.runtime.override_calls import OverrideCalls

HEAD = "[titan] 2026-11-30 20:04:{sec:02d},774 - root - INFO - "


def _log(tmp_path, *, calls_lines, layers=4, steps=2, name="my_kernels.rope"):
    lines = []
    for rank in (0, 1):
        for layer in range(layers):
            lines.append(f"[rank{rank}]:" + HEAD.format(sec=1) + f"[Override] {name}: model_spec.model.layers.{layer}"
                         ".attention.rope CosSinRoPE.Config -> MyRoPE.Config")
        lines.append(f"[rank{rank}]:" + HEAD.format(sec=1) + f"Applied {layers} override(s)")
    lines += calls_lines
    for step in range(1, steps + 1):
        lines.append("[rank0]:" + HEAD.format(sec=step + 2) + f"step: {step}  loss:  7.5  grad_norm:  1.0  "
                     "memory:  0.9GiB(3.9%)  tps: 100  tflops: 0.00  mfu: 0.00%")
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def _calls(rank, calls, fallbacks, modules=4, name="my_kernels.rope", reason=None):
    return f"[rank{rank}]:" + HEAD.format(sec=2) + format_calls_line(name, calls, fallbacks, modules, rank, reason=reason)


def _inspect(path, cwd):
    result = run_subprocess("inspect-logs", str(path), "--json", "--expect-layers", "4", cwd=cwd)
    report = json.loads(result.out)
    findings = {f["code"]: f for f in report["findings"]}
    # an error finding makes inspect-logs exit 1 (a broken override must not look clean in a script)
    has_error = any(f["severity"] == "error" for f in findings.values())
    assert result.code == (1 if has_error else 0), result.text
    return report, findings


def test_line_format_round_trips_with_a_reason_that_has_colons():
    line = format_calls_line("a.b", 3, 1, 2, 5, reason="positions (2, 128): no match")
    assert line == "[OverrideCalls] a.b: calls=3 fallbacks=1 modules=2 rank=5 step=1 reason: positions (2, 128): no match"
    assert parse_calls_line("[rank5]:[titan] x - root - INFO - " + line) == {
        "name": "a.b", "calls": 3, "fallbacks": 1, "modules": 2, "rank": 5, "step": 1, "reason": "positions (2, 128): no match"}
    assert parse_calls_line(format_calls_line("a.b", 3, 0, 2, 0, reason="ignored without fallbacks"))["reason"] is None
    assert parse_calls_line("[Override] a.b: x A -> B") is None


def test_counter_logs_once_after_the_first_optimizer_step(caplog):
    import logging

    import torch

    counter = OverrideCalls("test.counter")
    counter.arm()
    counter.arm()  # idempotent: one hook
    module_a, module_b = object(), object()
    counter.ran(module_a)
    counter.ran(module_a, module_b)
    counter.fell_back("not this shape")
    param = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([param], lr=0.1)
    with caplog.at_level(logging.INFO, logger=""):
        for _ in range(3):
            param.sum().backward()
            opt.step()
    lines = [r.getMessage() for r in caplog.records if "[OverrideCalls] test.counter" in r.getMessage()]
    assert lines == ["[OverrideCalls] test.counter: calls=2 fallbacks=1 modules=2 rank=0 step=1 reason: not this shape"]


def test_healthy_override_reports_its_calls_in_json(tmp_path):
    path = _log(tmp_path, calls_lines=[_calls(0, 8, 0), _calls(1, 8, 0)])
    report, findings = _inspect(path, tmp_path)
    entry = report["overrides"]["my_kernels.rope"]
    assert (entry["count"], entry["calls"], entry["fallbacks"], entry["modules"], entry["ranks"]) == (4, 16, 0, 4, [0, 1])
    assert findings["override-ran"]["severity"] == "info" and "override-ok" in findings
    assert not [f for f in report["findings"] if f["severity"] != "info" and "override" in f["code"]]


@pytest.mark.parametrize(
    ("calls_lines", "code", "severity"),
    [
        ([_calls(0, 0, 8, modules=0, reason="seq len 300"), _calls(1, 0, 8, modules=0)], "override-always-fell-back", "error"),
        ([_calls(0, 0, 0, modules=0)], "override-never-ran", "error"),
        ([_calls(0, 6, 2, reason="seq len 300"), _calls(1, 8, 0)], "override-fallbacks", "warning"),
        ([_calls(0, 4, 0, modules=2)], "override-idle-layers", "warning"),
        ([], "override-unverified", "warning"),
    ],
)
def test_an_override_that_did_not_run_its_code_is_not_healthy(tmp_path, calls_lines, code, severity):
    path = _log(tmp_path, calls_lines=calls_lines)
    report, findings = _inspect(path, tmp_path)
    assert findings[code]["severity"] == severity, report["findings"]
    assert "override-ran" not in findings
    entry = report["overrides"]["my_kernels.rope"]
    if calls_lines:
        assert entry["calls"] == sum(parse_calls_line(l)["calls"] for l in calls_lines)
        assert entry["fallbacks"] == sum(parse_calls_line(l)["fallbacks"] for l in calls_lines)
    else:
        assert entry["calls"] is None and entry["fallbacks"] is None  # not reported, not "0"
    if code == "override-always-fell-back":
        assert "seq len 300" in findings[code]["message"]
        strict = run_subprocess("inspect-logs", str(path), "--strict", cwd=tmp_path)
        assert strict.code == 1


def test_a_patch_without_override_lines_still_gets_an_entry(tmp_path):
    """trnqwen's hf-v5 patches log [OverrideCalls] without any [Override] line."""
    path = _log(tmp_path, calls_lines=[_calls(0, 1, 0, modules=1, name="trnqwen.runtime.hf_rope")])
    report, findings = _inspect(path, tmp_path)
    entry = report["overrides"]["trnqwen.runtime.hf_rope"]
    assert (entry["count"], entry["calls"], entry["fallbacks"], entry["modules"]) == (0, 1, 0, 1)
