"""The engine's summary of other ranks' step lines against reading every line one by one
(``LogParser.summarize = False``).

Logs are generated with what real multi-rank logs mix in: ANSI colours or none, every rank or
only rank 0 printing step lines, mfu N/A, thousands separators, NaN losses, high memory, rank-0
validation and info lines, warnings that mention ``loss:``, restarts, a crash in the middle,
stacked torchrun prefixes, CRLF, non-ASCII and invalid UTF-8 - and every one is fed in chunks
of many sizes, so lines straddle chunk boundaries.  Everything the parser records must be the
same, except ``recognized_lines``.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from trnqwen.logs.engine import LogParser, parse
from trnqwen.contract.stepline import format_step_line, lr_text

E = "\x1b"


def colour_step(step, loss, gn, gib, pct, tps, tflops, mfu) -> str:
    """torchtitan 0.3.0's coloured step line (components/metrics.py layout)."""
    mfu_s = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return (f"{E}[31mstep: {step:2}  {E}[32mloss: {loss:8.5f}  {E}[38;2;180;60;0mgrad_norm: {gn:7.4f}  "
            f"{E}[38;2;54;234;195mmemory: {gib:5.2f}GiB({pct:.2f}%)  {E}[34mtps: {round(tps):,}  "
            f"{E}[36mtflops: {tflops:,.2f}  {E}[35mmfu: {mfu_s}{E}[39m")


CHATTER = [  # chatter between the step lines, and near misses the engine must still read
    ("DEBUG", "dataloader worker {k}: prefetched batch in {k}1 ms"),
    ("INFO", "profiler: forward {k}.5 ms, backward {k}.1 ms - INFO - not a header"),
    ("DEBUG", "NCCL INFO comm 0x{k} rank {k} nranks 8 - Init COMPLETE"),  # a needle: " rank"
    ("INFO", "Saving checkpoint shard {k}"),  # a needle: "checkpoint"
    ("INFO", "model args: vocab_size={k}51936, n_layers=3{k}"),  # needles: the model's size is read
    ("WARNING", "chatty warning {k}"),  # a warning: counted and kept
    ("DEBUG", "note \u00e9 {k}"),  # non-ASCII
    ("INFO", "colour \x1b[31mred\x1b[39m {k}"),
    ("INFO", "[trnqwen] resumed from step {k}"),
    ("DEBUG", "Training completed {k}"),  # a needle: the run's end, as the engine reads it
    ("INFO", "peek at step: {k}"),
]


def generate(seed: int, *, ranks: int, steps: int, colour: bool, every_rank: bool, role: str = "rank",
             oddities: bool = True, lr: bool = False, near_capacity: bool = False, chatter: int = 0) -> bytes:
    rnd = random.Random(seed)
    out: list[bytes] = []

    def pre(r):
        return "" if r is None else f"[{role}{r}]:"

    def emit(r, msg, level="INFO", end="\n"):
        out.append(f"{pre(r)}[titan] 2026-11-29 10:00:0{rnd.randrange(10)},{rnd.randrange(1000):03d} - root - "
                   f"{level} - {msg}{end}".encode())

    rank_ids = [None] if ranks == 0 else list(range(ranks))
    for r in rank_ids:
        emit(r, "Building qwen3 4B")
        emit(r, "[Override] m.f: model_spec.model.layers.0.attention.rope A.Config -> B.Config")
        emit(r, "Applied 1 override(s)")
        emit(r, "Training starts at step 1")
        emit(r, _lora_line(r, 0))
    step = 0
    crashed = False
    while step < steps:
        step += 1
        if oddities and step == steps // 2 and rnd.random() < 0.5:
            step -= rnd.randrange(1, 5)  # a restart: the counter goes back
        loss = 6.5 / (1 + step / 50) + 0.3
        for r in rank_ids:
            if not every_rank and r not in (None, 0):
                continue
            mfu = None if rnd.random() < 0.05 else 7.48 + (step % 3) / 100
            pct = 93.5 if rnd.random() < 0.02 else 40.0 + (r or 0)
            if near_capacity:  # most lines above 90%, equal maxima on a rank, now and then 100%
                pct = rnd.choice([100.0, 89.99, 90.0]) if rnd.random() < 0.05 else 90.0 + rnd.randrange(0, 1000, 7) / 100
            tps = rnd.choice([55, 999, 1234.0, 123456]) + (r or 0)
            tflops = rnd.choice([3.5, 1234.5])
            l_val = float("nan") if rnd.random() < 0.01 else loss
            args = (step, l_val, 1.0 + step % 7 / 10, pct / 4, pct, tps, tflops, mfu)
            msg = colour_step(*args) if colour else format_step_line(*args)
            if lr:  # trnqwen's ranks append the step's LR (runtime/lr_log.py): warm-up, then cosine
                msg += lr_text(2e-5 * min(1.0, step / 10) * (0.5 + 0.5 * math.cos(math.pi * step / steps)) + 1e-9)
            end = "\r\n" if oddities and rnd.random() < 0.01 else "\n"
            emit(r, msg, end=end)
            for k in range(chatter):  # mostly quiet lines; a near miss now and then; a rank not seen before
                level, text = CHATTER[0 if rnd.random() < 0.8 else rnd.randrange(len(CHATTER))]
                who = r if rnd.random() < 0.995 or r is None else ranks + 3
                emit(who, text.format(k=k), level)
            if not oddities:
                continue
            x = rnd.random()
            if x < 0.02:
                emit(r, f"Dataloader slow: waited 1.{step % 10}s for batch at step {step}", "WARNING")
            elif x < 0.03:
                emit(r, "loss: nan detected, skipping the update", "WARNING")  # "loss:" but no "step:"
            elif x < 0.035 and r in (None, 0):
                emit(r, f"validate step: {step}  loss: {loss:7.4f}  memory: 10.00GiB(40.00%)  tps: 1,000")
            elif x < 0.04 and r in (None, 0):
                emit(r, f"Saving the checkpoint (or staging if async is enabled) at step {step}. é")
            elif x < 0.043:
                emit(r, "something broke", "ERROR")
            elif x < 0.046 and r == 0:
                out.append(f"{pre(r)}{pre(r)}W1129 10:00:00.879000 10898 file.py:982] stacked prefixes\n".encode())
            elif x < 0.048:
                out.append(f"{pre(r)}plain print \xff\n".encode("latin-1"))  # invalid UTF-8
            elif x < 0.050 and r in (None, 0):
                emit(r, f"x{E}[0mstep: {step}  loss: 1.0")  # another layout: the regex path
            elif x < 0.052:
                emit(r, _lora_line(r, step))  # a [LoRA] line (trnqwen.contract.lora.log_line) after the primary rank is known
            elif x < 0.06 and near_capacity and r:  # another rank's validation at the highest memory: not a step
                emit(r, f"validate step: {step}  loss: {loss:7.4f}  memory: 24.00GiB(99.99%)  tps: 1,000")
        if oddities and not crashed and ranks > 1 and step == (2 * steps) // 3:
            crashed = True
            r = ranks - 1
            out.append(f"{pre(r)}Traceback (most recent call last):\n{pre(r)}  File \"x.py\", line 1, in <module>\n"
                       f"{pre(r)}    raise ValueError('bad')\n{pre(r)}ValueError: bad step: 3 loss: 2\n".encode())
    out.append(f"{pre(rank_ids[0])}[titan] 2026-11-29 11:00:00,000 - root - INFO - Training completed\n".encode())
    return b"".join(out)


def _lora_line(r, salt: int) -> str:
    from trnqwen.contract.lora import LoraSpec, log_line

    spec = LoraSpec(rank=16, alpha=32.0, dropout=0.0, targets=("q_proj", "v_proj"), seed=0, base_model="m")
    return log_line(trainable=1000 + salt, total=100_000, spec=spec, adapters=8, initialised=8, rank=r or 0)


def _plain(value):
    """A comparable form: NaN as a string, sets sorted, mappings and sequences recursively."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {repr(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def snapshot(log) -> dict:
    out = {}
    for f in dataclasses.fields(log):
        if f.name in ("recognized_lines", "source"):
            continue
        value = getattr(log, f.name)
        out[f.name] = _plain(list(log.steps.rows()) if f.name == "steps" else value)
    return out


def reference(data: bytes):
    parser = LogParser("x")
    parser.summarize = False
    for i in range(0, len(data), 1 << 20):
        parser.feed(data[i:i + (1 << 20)])
    return parser.close()


SHAPES = [
    dict(ranks=8, steps=300, colour=True, every_rank=True),
    dict(ranks=8, steps=300, colour=False, every_rank=True, role="default"),
    dict(ranks=2, steps=600, colour=True, every_rank=False),
    dict(ranks=1, steps=600, colour=False, every_rank=True),
    dict(ranks=0, steps=600, colour=True, every_rank=True),  # one unprefixed stream
    dict(ranks=8, steps=400, colour=True, every_rank=True, oddities=False),  # the exact layout only
    dict(ranks=8, steps=300, colour=True, every_rank=True, lr=True),  # trnqwen's lr column on every step line
    dict(ranks=2, steps=400, colour=False, every_rank=False, lr=True, oddities=False),
    dict(ranks=8, steps=300, colour=True, every_rank=True, lr=True, near_capacity=True),  # a run near HBM capacity
    dict(ranks=4, steps=300, colour=False, every_rank=True, near_capacity=True, oddities=False),
    dict(ranks=8, steps=200, colour=True, every_rank=True, lr=True, chatter=3),  # a chatty run (quiet lines)
    dict(ranks=2, steps=300, colour=False, every_rank=True, oddities=False, chatter=2),
]


@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("chunk", [7, 97, 4096, 65536, 1 << 24])
def test_fast_path_equals_reference(shape, chunk):
    data = generate(shape + 1, **SHAPES[shape])
    want = snapshot(reference(data))
    got = snapshot(parse(data, "x", chunk_size=chunk))
    assert want["steps"], "the generated log has steps"
    for key in want:
        assert got[key] == want[key], key


def test_summary_is_taken_and_equal_on_the_exact_layout(monkeypatch):
    """On torchtitan's exact layout the other ranks' step lines are summarized (not read one by
    one), and the result is still the reference's."""
    from trnqwen.logs import engine

    read: list = []
    line = engine.LogParser._line
    monkeypatch.setattr(engine.LogParser, "_line", lambda self, n, raw: (read.append(raw), line(self, n, raw))[1])
    for lr in (False, True):  # torchtitan's own lines, and trnqwen's with the lr column
        read.clear()
        data = generate(9, ranks=8, steps=400, colour=True, every_rank=True, oddities=False, lr=lr)
        got = parse(data, "x", chunk_size=1 << 16)
        others = sum(1 for raw in read if b"step:" in raw and not raw.startswith(b"[rank0]:"))
        assert others < 400, others  # of 2,800 other ranks' step lines
        assert snapshot(got) == snapshot(reference(data))
        lrs = [row["lr"] for row in got.steps.values()]
        assert not lr or (lrs and all(v is not None and v > 0 for v in lrs)), lrs[:3]


@pytest.mark.parametrize("width,start", [(8, 3), (5, 2)])
def test_rolling_medians_equal_statistics_median(width, start):
    """judge._rolling_medians (sorted windows, not np.median) against statistics.median."""
    import statistics

    import numpy as np

    from trnqwen.logs.judge import _rolling_medians

    rnd = random.Random(width)
    for n in (start + 1, width, width + 1, 300):
        values = np.array([rnd.choice([1.0, 2.5, 3.0]) if rnd.random() < 0.3 else rnd.uniform(0, 9) for _ in range(n)])
        want = [statistics.median(values[max(0, i - width):i].tolist()) for i in range(start, n)]
        assert _rolling_medians(values, width, start).tolist() == want


@pytest.mark.parametrize("chunk", [97, 1 << 16])
def test_near_capacity_keeps_each_ranks_first_maximum(chunk):
    """A run near HBM capacity (most lines above 90%, equal maxima on a rank): each other rank's
    first highest line, as the reference reads it."""
    data = generate(91, ranks=8, steps=300, colour=True, every_rank=True, lr=True, near_capacity=True, oddities=False)
    got = snapshot(parse(data, "x", chunk_size=chunk))
    assert got["rank_high_memory"] == snapshot(reference(data))["rank_high_memory"] and len(got["rank_high_memory"]) == 8


def test_benchmark_log_varies_every_column_as_real_runs_do():
    """benchmarks/inspect_logs.py's real shape: tflops and mfu follow tps, memory drifts (past
    90%), lr moves; the old log kept rank 0's tflops, mfu and memory constant (issue 28 item 19)."""
    import importlib.util
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(here))
    try:
        spec = importlib.util.spec_from_file_location("bench_inspect_logs", here / "inspect_logs.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(here))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.log"
        mod.generate(path, ranks=2, steps=3000)
        log = parse(path.read_bytes(), str(path))
    steps = list(log.steps.rows())[1:]
    for name in ("tps", "tflops", "mfu", "memory_gib", "memory_pct", "lr", "loss", "grad_norm"):
        assert len({s[name] for s in steps}) > 10, name
    assert max(s["memory_pct"] for s in steps) > 90 > min(s["memory_pct"] for s in steps)
    assert any(s["tps"] < 1000 for s in steps) and any(s["tps"] >= 1000 for s in steps)  # with and without a comma
    assert log.rank_high_memory.get(1, {}).get("pct", 0) > 90  # the other rank too


def test_whole_column_numbers_equal_reading_each_token():
    """engine._numbers / _percents (a step-line column converted at once) against fast_step's
    reading of each token, on columns of odd tokens too."""
    from trnqwen.logs.engine import _numbers, _percents

    def each(f, tokens):
        try:
            return repr([f(t) for t in tokens])  # repr: NaN equals NaN
        except ValueError:
            return ValueError

    def whole(f, tokens):
        try:
            return repr(f(tokens))
        except ValueError:
            return ValueError

    rnd = random.Random(5)
    pool = [b"1,234", b"999", b"12.5", b"1,2,3", b",", b"nan", b"7", b"1e3", b"x", b"3%"]
    tails = [b"%", b"%\x1b[39m", b"%\x1b[0m"]
    mfu_pool = [b"4.83%\x1b[39m", b"5%\x1b[39m", b"N/A", b"N/A\x1b[39m", b"%\x1b[39m", b"4.8", b"3%%\x1b[39m",
                b"1%\x1b[39m2%\x1b[39m", b"2.5%", b"7%\x1b[0m"]
    for _ in range(3000):
        n = rnd.randrange(1, 6)
        tokens = tuple(rnd.choice(pool) for _ in range(n))
        assert whole(_numbers, tokens) == each(lambda t: float(t.replace(b",", b"")), tokens), tokens
        if rnd.random() < 0.5:
            tail = rnd.choice(tails)
            tokens = tuple(rnd.choice([b"4.83", b"5", b"0.00", b"x"]) + tail for _ in range(n))
        else:
            tokens = tuple(rnd.choice(mfu_pool) for _ in range(n))
        want = each(lambda m: None if m.startswith(b"N/A") else float(m[: m.find(b"%")]), tokens)
        assert whole(_percents, tokens) == want, tokens


@pytest.mark.parametrize("shape", [0, 3, 8])
def test_json_steps_are_the_rows_with_nan_and_inf_named(shape):
    """--json's steps (report.steps_json, written from the columns) are the rows read one by one, a
    NaN/Inf value null and named in ``nonfinite``, a missing mfu null; valid JSON (no NaN)."""
    import json

    from trnqwen.logs.report import steps_json

    log = parse(generate(shape + 40, **SHAPES[shape]), "x")
    want = []
    for rec in log.steps.rows():
        bad = {k: "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
               for k, v in rec.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            rec = {**rec, **dict.fromkeys(bad), "nonfinite": bad, "line": rec["line"]}
            rec["line"] = rec.pop("line")
        want.append(rec)
    rows = json.loads(steps_json(log), parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert rows == want and any("nonfinite" in r for r in rows) and any(r["mfu"] is None for r in rows)
