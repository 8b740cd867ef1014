"""The bulk fast path (logs/bulk.py) against the per-line reference parser (``fast=False``).

Logs are generated with what real multi-rank logs mix in: ANSI colours or none, every rank or
only rank 0 printing step lines, mfu N/A, thousands separators, NaN losses, high memory, rank-0
validation and info lines, warnings that mention ``loss:``, restarts, a crash in the middle,
stacked torchrun prefixes, CRLF, non-ASCII and invalid UTF-8 - and every one is fed in chunks
of many sizes, so lines straddle chunk boundaries.  Everything the parser records must be the
same, except ``recognized_lines`` (the fast path does not count other ranks' step lines).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random

import pytest

from trnqwen.logs.engine import LogParser
from trnqwen.logs.parse import parse_bytes
from trnqwen.contract.stepline import format_step_line, lr_text

E = "\x1b"


def colour_step(step, loss, gn, gib, pct, tps, tflops, mfu) -> str:
    """torchtitan 0.3.0's coloured step line (components/metrics.py layout)."""
    mfu_s = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return (f"{E}[31mstep: {step:2}  {E}[32mloss: {loss:8.5f}  {E}[38;2;180;60;0mgrad_norm: {gn:7.4f}  "
            f"{E}[38;2;54;234;195mmemory: {gib:5.2f}GiB({pct:.2f}%)  {E}[34mtps: {round(tps):,}  "
            f"{E}[36mtflops: {tflops:,.2f}  {E}[35mmfu: {mfu_s}{E}[39m")


CHATTER = [  # lines that only count (bulk.quiet_lines), and near misses the engine must still read
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
                emit(r, _lora_line(r, step))  # a [LoRA] line (trnqwen.train.lora) after the primary rank is known
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
        out[f.name] = _plain(log.step_list() if f.name == "steps" else value)
    return out


def reference(data: bytes):
    parser = LogParser("x", fast=False)
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
    got = snapshot(parse_bytes(data, "x", chunk_size=chunk))
    assert want["steps"], "the generated log has steps"
    for key in want:
        assert got[key] == want[key], key


def test_fast_path_is_taken_and_equal_on_the_exact_layout(monkeypatch):
    """On torchtitan's exact layout the bulk reader stores every primary step (it is not
    silently falling back to the per-line path), and the result is still the reference's."""
    from trnqwen.logs import bulk

    stored = []
    real = bulk.primary_columns

    def spy(bodies, lines, prefix):
        cols = real(bodies, lines, prefix)
        stored.append(None if cols is None else len(cols[0]))
        return cols

    monkeypatch.setattr(bulk, "primary_columns", spy)
    for lr in (False, True):  # torchtitan's own lines, and trnqwen's with the lr column
        stored.clear()
        data = generate(9, ranks=8, steps=400, colour=True, every_rank=True, oddities=False, lr=lr)
        got = parse_bytes(data, "x", chunk_size=1 << 16)
        assert None not in stored and sum(stored) > 350, lr
        assert snapshot(got) == snapshot(reference(data))
        lrs = [row["lr"] for row in got.steps.values()] if hasattr(got.steps, "values") else []
        assert not lr or (lrs and all(v is not None and v > 0 for v in lrs)), lrs[:3]


@pytest.mark.parametrize("shape", [0, 2, 5])
def test_planned_in_worker_processes_equals_reference(tmp_path, monkeypatch, shape):
    """parallel.read_file: the regions planned in worker processes are used, and the result is
    the reference's (small blocks, so many regions and lines across block boundaries)."""
    from trnqwen.logs import parallel
    from trnqwen.logs.parse import parse_file

    used = []

    class Counting(parallel.LogParser):
        def __setattr__(self, name, value):
            if name == "planned" and value is not None:
                real = value

                def value(*args):
                    plan = real(*args)
                    used.append(plan is not None)
                    return plan
            super().__setattr__(name, value)

    monkeypatch.setattr(parallel, "LogParser", Counting)
    data = generate(shape + 20, **SHAPES[shape])
    path = tmp_path / "train.log"
    path.write_bytes(data)
    got = parse_file(path, chunk_size=4099, workers=2)
    assert sum(used) > 10
    assert snapshot(got) == snapshot(reference(data))


def test_workers_only_for_big_files(monkeypatch):
    from trnqwen.logs import parallel

    assert parallel.workers_for(1 << 20) == 0
    monkeypatch.setenv("TRNQWEN_LOG_WORKERS", "0")
    assert parallel.workers_for(1 << 30) == 0


def test_failing_workers_leave_the_result_unchanged(tmp_path, monkeypatch):
    """A worker that raises (or a pool that breaks) only means the engine plans those regions
    itself."""
    from trnqwen.logs import parallel
    from trnqwen.logs.parse import parse_file

    def broken(*args):
        raise RuntimeError("worker failed")

    monkeypatch.setattr(parallel, "_plan_block", broken)  # forked workers inherit it
    data = generate(31, **SHAPES[0])
    path = tmp_path / "train.log"
    path.write_bytes(data)
    assert snapshot(parse_file(path, chunk_size=4099, workers=2)) == snapshot(reference(data))


@pytest.mark.parametrize("first_piece,window", [(1000, 8), (1000, 700), (1 << 20, 1 << 17)])
@pytest.mark.parametrize("shape", [0, 2, 5])
def test_one_worker_sharing_the_blocks_equals_reference(tmp_path, monkeypatch, shape, first_piece, window):
    """Two cores: one worker, and this process plans every other block itself (the first block
    read in two pieces, or whole); the blocks a worker planned are not read here, only the
    windows it sent (small windows: the engine often needs more, and reads the block)."""
    from trnqwen.logs import parallel
    from trnqwen.logs.parse import parse_file

    monkeypatch.setattr(parallel, "FIRST_PIECE", first_piece)
    monkeypatch.setattr(parallel, "WINDOW", window)
    assert [parallel.planned_here(i, 1) for i in range(4)] == [True, False, True, False]
    assert [parallel.planned_here(i, 2) for i in range(4)] == [True, False, False, True]
    data = generate(shape + 40, **SHAPES[shape])
    path = tmp_path / "train.log"
    path.write_bytes(data)
    assert snapshot(parse_file(path, chunk_size=4099, workers=1)) == snapshot(reference(data))
    # both fast paths ran: blocks planned by the worker, and this process's share planned on a
    # mapping of the file (not read: a copy of each block cost a tenth of the parse here)
    assert parallel.BLOCKS["by_workers"] > 0 and parallel.BLOCKS["mapped_here"] > 0


def test_a_log_cut_short_while_read_is_read_as_far_as_it_goes(tmp_path, monkeypatch):
    """A copy-truncate rotation during the read: the blocks past the new end are neither mapped
    nor planned (parallel's size check, _plan_block's own), what is left is read, nothing crashes."""
    from trnqwen.logs import engine, parallel
    from trnqwen.logs.parse import parse_file

    data = generate(33, **SHAPES[0])
    path = tmp_path / "train.log"
    path.write_bytes(data)
    fed = []
    feed = engine.LogParser.feed

    def feed_then_cut(self, block):
        fed.append(len(block))
        if len(fed) == 40:
            os.truncate(path, len(data) // 2)
        return feed(self, block)

    monkeypatch.setattr(engine.LogParser, "feed", feed_then_cut)
    log = parse_file(path, chunk_size=4099, workers=1)
    assert len(fed) > 40 and log.lines < data.count(b"\n")
    assert parallel.BLOCKS["mapped_here"] < 20 and parallel.BLOCKS["read"] > 0


def test_workers_env_sets_the_count(monkeypatch):
    from trnqwen.logs import parallel

    monkeypatch.setenv("TRNQWEN_LOG_WORKERS", "3")
    assert parallel.workers_for(1 << 30) == 3
    assert parallel.workers_for(1 << 20) == 0  # small files: never


@pytest.mark.parametrize("shape", [0, 1, 3])
def test_classified_in_small_pieces_equals_reference(monkeypatch, shape):
    """bulk.line_table cuts a big region into pieces at newlines: tiny pieces (lines longer than
    a piece too) give the reference's result."""
    from trnqwen.logs import bulk

    monkeypatch.setattr(bulk, "PIECE", 97)
    data = generate(shape + 50, **SHAPES[shape])
    assert snapshot(parse_bytes(data, "x", chunk_size=1 << 16)) == snapshot(reference(data))


@pytest.mark.parametrize("sample", [2, 16])
def test_line_classes_equal_a_search_of_every_line(monkeypatch, sample):
    """bulk.line_table learns where ``step:``/``loss:`` sit from a sample of lines and tests the
    others there with one load each: lines with the words elsewhere (another rank width, a step
    number that grew, a word twice, at a line's very end, in a line shorter than 8 bytes at the
    region's end) are still found, and nothing is marked that does not hold the words."""
    from trnqwen.logs import bulk

    monkeypatch.setattr(bulk, "SAMPLE", sample)
    rnd = random.Random(sample)
    shapes = [
        lambda r, s: f"[rank{r}]:[titan] 2026-11-29 09:00:00,000 - root - INFO - step: {s:2}  loss:  2.50000  grad",
        lambda r, s: f"[rank{r}]:\x1b[31mstep: {s}  \x1b[32mloss: 1.0",
        lambda r, s: f"[rank{r}]:warning at step: {s}",
        lambda r, s: f"[rank{r}]:loss: 3 then step: {s}",
        lambda r, s: f"step: {s} loss: step: loss:",
        lambda r, s: "x" * (s % 9) + "loss:step:",
        lambda r, s: "step:",
        lambda r, s: "",
        lambda r, s: f"[rank{r}]:steploss: {s} (memory: 1.0GiB(95.00%))",
    ]
    for trial in range(40):
        weights = [rnd.random() ** 3 for _ in shapes]
        lines = [rnd.choices(shapes, weights)[0](rnd.choice([0, 1, 7, 12, 100]), rnd.randrange(1, 3000)) for _ in range(rnd.randrange(1, 400))]
        if rnd.random() < 0.3:
            lines.append(rnd.choice(["loss:", "step:", "ab", "step:loss:"]))
        pad = b"#" * rnd.randrange(0, 5)
        body = "\n".join(lines).encode()
        buf = pad + body + b"\n" * rnd.randrange(0, 2) + pad
        end = len(pad) + len(body)
        starts, ends, primary, steplike, parens = bulk.line_table(buf, len(pad), end, b"[rank0]:")
        assert parens.tolist() == [k for k, c in enumerate(body) if c == 40]
        got = [buf[len(pad) + a: len(pad) + b] for a, b in zip(starts.tolist(), ends.tolist())]
        assert got == body.split(b"\n")
        assert steplike.tolist() == [b"step:" in x and b"loss:" in x for x in got]
        assert primary.tolist() == [b"step:" in x and b"loss:" in x and x.startswith(b"[rank0]:") for x in got]


def test_quiet_lines_of_a_chatty_log_are_counted_not_read(monkeypatch):
    """bulk.quiet_lines: a chatty run's DEBUG/INFO lines that hold nothing the engine looks for
    never reach the per-line reader (7 us each), and the result is the reference's."""
    from trnqwen.logs import engine

    data = generate(70, **SHAPES[10])
    chatter = data.count(b"prefetched batch")
    read: list = []
    line = engine.LogParser._line
    monkeypatch.setattr(engine.LogParser, "_line", lambda self, n, raw: (read.append(raw), line(self, n, raw))[1])
    log = parse_bytes(data, "x", chunk_size=1 << 16)
    quiet_read = sum(b"prefetched batch" in raw for raw in read)
    # (read one by one: the lines before the primary rank is known, and a region's straddling line)
    assert chatter > 3000 and quiet_read < chatter // 5, (chatter, quiet_read)
    assert snapshot(log) == snapshot(reference(data))


def _float_ref(col, commas):
    try:
        return [float(t.replace(b",", b"") if commas else t) for t in col]
    except ValueError:
        return "ValueError"


def test_number_columns_equal_float_and_int():
    """numbers.float_columns / ints: bit for bit what float() / int() give, and the same errors,
    for fixed layouts (the matrix path), mixed ones (the joined path) and anything else."""
    import struct

    from trnqwen.logs import numbers

    rnd = random.Random(7)
    odd = [b"", b".", b"-1", b"1e5", b"nan", b"inf", b"1..2", b"1.2.3", b"1\x002", b"12\x00", b"1_0", b"+3", b"0x1"]

    def token(layout):
        if layout is not None and rnd.random() < 0.97:
            return bytes(rnd.choice(b"0123456789") if c == 100 else c for c in layout)
        digits = "".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 17)))
        if rnd.random() < 0.8:
            cut = rnd.randint(0, len(digits))
            digits = digits[:cut] + "." + digits[cut:]
        if rnd.random() < 0.2:
            cut = rnd.randint(0, len(digits))
            digits = digits[:cut] + "," + digits[cut:]
        return rnd.choice(odd) if rnd.random() < 0.005 else digits.encode()

    def bits(values):
        return values if isinstance(values, str) else [struct.pack("<d", v) for v in values]

    for _ in range(1500):
        cols = []
        for _ in range(rnd.randint(1, 4)):
            layout = None
            if rnd.random() < 0.7:
                layout = bytes(rnd.choice([100, 100, 100, 46, 44, 48]) for _ in range(rnd.randint(1, 18)))
            cols.append([token(layout) for _ in range(rnd.randint(1, 40))])
        for commas in (False, True):
            want = [bits(_float_ref(col, commas)) for col in cols]
            want = "ValueError" if "ValueError" in want else want
            try:
                got = [bits(list(a)) for a in numbers.float_columns(cols, commas=commas)]
            except ValueError:
                got = "ValueError"
            assert got == want, cols
        col = cols[0]
        try:
            want_int = list(map(int, col))
        except ValueError:
            want_int = "ValueError"
        try:
            got_int = list(numbers.ints(col))
        except (ValueError, OverflowError):
            got_int = "ValueError"
        if not (isinstance(want_int, list) and max(map(abs, want_int)) >= 1 << 63):
            assert got_int == want_int, col
    assert list(numbers.floats([b"0.1", b"2.675", b"123456789012345", b".5", b"5."])) == [0.1, 2.675, 123456789012345.0, 0.5, 5.0]


@pytest.mark.parametrize("batch", [7, 1000, 16384])
@pytest.mark.parametrize("shape", [0, 2, 5, 8])
def test_streamed_json_steps_equal_json_dumps(monkeypatch, shape, batch):
    """--json's steps, encoded column-wise in batches (constant columns, repeating ones, NaN,
    mfu N/A, restarts), are exactly json.dumps of the row dicts."""
    import json

    from trnqwen.logs import report

    monkeypatch.setattr(report.StepRowsJSON, "BATCH", batch)
    log = parse_bytes(generate(shape + 60, **SHAPES[shape]), "x")
    assert len(log.steps) > 100
    assert "".join(report.StepRowsJSON(log).chunks()) == json.dumps(report.step_rows(log))
    # one value in a whole column: the repeated-text path (a column without absent values)
    for name in ("memory_gib", "tflops"):
        col = log.steps.cols[name]
        assert not log.steps.missing[name]
        col[:] = type(col)("d", [12.5] * len(col))
    assert "".join(report.StepRowsJSON(log).chunks()) == json.dumps(report.step_rows(log))
    # repeating columns with values json.dumps writes its own way: -0.0 beside 0.0, a fractional
    # or huge tps (int text only for whole numbers below 2**53), infinities
    rnd = random.Random(shape)
    odd = {"memory_gib": [0.0, -0.0, 1.5], "tps": [1234.0, 1234.5, -0.0, 2.0**60, 9007199254740993.0],
           "tflops": [0.1, 0.2, float("inf"), 3.0], "loss": [7.25, -0.0, 1e-300]}
    for name, pool in odd.items():
        col = log.steps.cols[name]
        col[:] = type(col)("d", [rnd.choice(pool) for _ in range(len(col))])
    assert "".join(report.StepRowsJSON(log).chunks()) == json.dumps(report.step_rows(log))


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


def test_lazy_block_answers_like_the_bytes(tmp_path):
    """lazyblock.LazyBlock: find/rfind/count/startswith/slices from its two windows or the
    whole block, always what the bytes themselves answer."""
    import os

    from trnqwen.logs.lazyblock import LazyBlock

    rnd = random.Random(3)
    data = bytes(rnd.choice(b"ab\n") for _ in range(3000))
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100 + data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(300):
            head = rnd.randrange(0, 200)
            tail_at = rnd.randrange(head, len(data) + 1)
            lazy = LazyBlock(fd, 100, len(data), data[:head], tail_at, data[tail_at:])
            for _ in range(20):
                a = rnd.randrange(0, len(data) + 1)
                b = rnd.randrange(a, len(data) + 1)
                sub = rnd.choice([b"\n", b"a", b"ab\n", b"ba"])
                assert lazy.find(sub, a, b) == data.find(sub, a, b)
                assert lazy.rfind(sub, a, b) == data.rfind(sub, a, b)
                assert lazy.count(sub, a, b) == data.count(sub, a, b)
                assert lazy.startswith(sub, a) == data.startswith(sub, a)
                assert lazy[a:b] == data[a:b]
            assert lazy.find(b"\n") == data.find(b"\n") and lazy.rfind(b"\n") == data.rfind(b"\n")
            assert lazy[:a] == data[:a] and lazy[a:] == data[a:] and len(lazy) == len(data)
        short = LazyBlock(fd, 100, len(data) + 50, b"", 0, b"")
        with pytest.raises(OSError):
            short.whole()  # the file is shorter than the block: changed while read
    finally:
        os.close(fd)


def test_near_capacity_region_reads_back_one_line_per_rank():
    """A run near HBM capacity has a match of the high-memory pattern on most lines: the plan
    hands the engine each other rank's first maximum only (it handed every line, each read back
    with three regexes: 4x the whole parse, issue 28 item 19), and the result is the reference's."""
    from trnqwen.logs import bulk

    data = generate(91, ranks=8, steps=300, colour=True, every_rank=True, lr=True, near_capacity=True, oddities=False)
    start = data.index(b"\n", len(data) // 4) + 1
    end = data.rindex(b"\n", 0, 3 * len(data) // 4)
    plan = bulk.plan_region(data, start, end, b"[rank0]:", 1 << 20)
    assert not plan.fallback and plan.lines > 500
    ranks = {bytes(raw[: raw.index(b"]") + 1]) for _, raw in plan.memory}
    assert len(plan.memory) == len(ranks) <= 7 and b"[rank0]" not in ranks
    assert snapshot(parse_bytes(data, "x"))["rank_high_memory"] == snapshot(reference(data))["rank_high_memory"]


def test_benchmark_log_varies_every_column_as_real_runs_do():
    """benchmarks/inspect_logs.py's real shape: tflops and mfu follow tps, memory drifts (past
    90%), lr moves; the old log kept rank 0's tflops, mfu and memory constant (issue 28 item 19)."""
    import importlib.util
    import sys
    from pathlib import Path

    from trnqwen.logs.parse import parse_file

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
        log = parse_file(path)
    steps = log.step_list()[1:]
    for name in ("tps", "tflops", "mfu", "memory_gib", "memory_pct", "lr", "loss", "grad_norm"):
        assert len({s[name] for s in steps}) > 10, name
    assert max(s["memory_pct"] for s in steps) > 90 > min(s["memory_pct"] for s in steps)
    assert any(s["tps"] < 1000 for s in steps) and any(s["tps"] >= 1000 for s in steps)  # with and without a comma
    assert log.rank_high_memory.get(1, {}).get("pct", 0) > 90  # the other rank too
