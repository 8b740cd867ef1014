"""The launcher's progress follows the metrics stream; rank 0 prints a step's line just before it
writes the step's record, so the first line must wait for the record rather than be shown twice."""
import io
import threading
import time

from trnqwen.contract.metrics_stream import MetricsWriter
from trnqwen.train.launch_result import LaunchResult
from trnqwen.train.progress import Progress
from trnqwen.train.status import StatusLine

LINE = "[rank0]: step:  1  loss:  0.6932  grad_norm:  1.0000  memory:  1.00GiB(1.00%)  tps: 155  tflops: 0.00  mfu: 0.00%"


def _progress(tmp_path, out):
    status = StatusLine(stream=out, total_steps=3)
    return Progress(LaunchResult(exit_code=0, ended_by="completed"), status=status,
                    metrics_path=tmp_path / "metrics.jsonl", start=time.monotonic())


def test_a_record_written_just_after_its_line_is_shown_once_with_its_values(tmp_path):
    out = io.StringIO()
    progress = _progress(tmp_path, out)
    writer = MetricsWriter(tmp_path / "metrics.jsonl")

    def late_record():
        time.sleep(0.3)
        writer.write("step", 1, {"loss": 0.6931, "dpo/margin": 0.0})

    thread = threading.Thread(target=late_record)
    thread.start()
    progress.line(LINE)
    thread.join()
    shown = [ln for ln in out.getvalue().splitlines() if ln.startswith("step 1/3")]
    assert len(shown) == 1 and "0.6931" in shown[0], out.getvalue()
    assert progress.from_stream and progress.result.steps == [{"step": 1, "loss": 0.6931, "dpo/margin": 0.0}]


def test_without_a_stream_the_line_is_shown_after_one_bounded_wait(tmp_path, monkeypatch):
    import trnqwen.train.progress as progress_module

    monkeypatch.setattr(progress_module, "FIRST_RECORD_WAIT_S", 0.2)
    out = io.StringIO()
    progress = _progress(tmp_path, out)
    progress.line(LINE)
    progress.line(LINE.replace("step:  1", "step:  2"))
    assert not progress.from_stream and [s["step"] for s in progress.result.steps] == [1, 2]
    assert progress._waited
