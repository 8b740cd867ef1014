"""Messages that say what they mean (issue 34 item 14): facts of the plan are information, not
warnings; the generated config module says why it starts from qwen3_32b(); eval of a run still
going says so; a resumed run's first step is not a throughput drop; the CPU attention override
trnqwen installs itself is not listed as the user's.  (The LR warning's wording and the
random-weight tiny model: tests/test_schedule.py; "an assistant turn": tests/test_dpo.py.)
"""

from __future__ import annotations

import json

TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1", "--steps", "2", "--seq-len", "128",
        "--finetune", "--backend", "native"]


def test_the_plan_is_information_not_warnings(cli, in_tmp, tiny_assets):
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--lora", "--export-config", "run_cfg.py")
    assert r.code == 0, r.text
    assert "plan: LoRA rank 16" in r.err and "plan: no registered Qwen3 flavor" in r.err, r.err
    assert "warning:" not in r.err, r.err


def test_the_config_module_says_why_it_starts_from_the_32b_recipe(cli, in_tmp, tiny_assets):
    plan = json.loads(cli("train", *TINY, "--assets", str(tiny_assets), "--dry-run", "--json").out)
    lines = plan["config_module_text"].splitlines()
    base = next(i for i, line in enumerate(lines) if line.strip().startswith("config = qwen3_32b()"))
    why = " ".join(line.strip() for line in lines[max(0, base - 3):base] if line.strip().startswith("#"))
    assert "qwen3_32b()" in why and "replaced" in why, lines[base - 3:base + 1]


def test_eval_of_a_run_still_going_says_it_is_still_running(cli, in_tmp):
    import os

    import psutil

    from trnqwen.rundir import RunRecord, point_last

    runs, root = in_tmp / ".trnqwen" / "runs", in_tmp / "ck"
    (root / "resume" / "step-2").mkdir(parents=True)  # a resume point, no export yet
    for name in ("__0_0.distcp", ".metadata"):
        (root / "resume" / "step-2" / name).write_bytes(b"x")
    (runs / "r-live").mkdir(parents=True)
    me = psutil.Process(os.getpid())  # this process stands in for the run's launcher
    record = RunRecord(run_id="r-live", run_dir=str(runs / "r-live"), status="running", checkpoint_dir=str(root),
                       extra={"launcher_pid": me.ppid(), "launcher_started_at": psutil.Process(me.ppid()).create_time()})
    record.save()
    point_last(runs, "r-live")
    r = cli("eval")
    assert r.code == 2 and "run r-live is still running" in r.err, r.text
    assert "trnqwen train --resume" not in r.text, r.text
    record.extra["launcher_pid"] = 2**22 + 17  # killed without a word: no such process, resuming is the way on
    record.save()
    r = cli("eval")
    assert r.code != 0 and "still running" not in r.err and "--resume" in r.text, r.text


def test_a_resumed_runs_first_step_is_not_a_throughput_drop(tmp_path, cli):
    from tests.test_inspect_logs import line, step_msg

    text = [line("Training starts at step 1")]
    text += [line(step_msg(i, 7.0 - i / 10, tps=50 if i == 1 else 1000)) for i in range(1, 5)]
    text.append("[trnqwen] resumed run r1 from step 4 (/c/resume/step-4)\n")
    text.append(line("Training starts at step 5"))
    text.append(line(step_msg(5, 6.4, tps=60)))  # its own start-up and compilation, like step 1
    text.append(line("Training completed"))
    p = tmp_path / "train.log"
    p.write_text("".join(text))
    doc = json.loads(cli("inspect-logs", str(p), "--json").out)
    codes = [f["code"] for f in doc["findings"]]
    assert "resumed" in codes and "throughput-collapse" not in codes, doc["findings"]
    # a real drop after the resumed run's first step is still found
    p.write_text("".join(text[:-1]) + "".join(line(step_msg(i, 6.3, tps=200)) for i in (6, 7, 8))
                 + line("Training completed"))
    doc = json.loads(cli("inspect-logs", str(p), "--json").out)
    assert "throughput-collapse" in [f["code"] for f in doc["findings"]], doc["findings"]


def test_trnqwens_own_cpu_attention_override_is_not_listed_as_the_users(tmp_path, cli):
    from tests.test_inspect_logs import line, step_msg

    name = "trnqwen.runtime.cpu_attention.cpu_dense_attention"
    mine = "my_kernels.rope"
    text = [line("Training starts at step 1")]
    for who in (name, mine):
        text += [line(f"[Override] {who}: model_spec.model.layers.{i}.attention.inner_attention "
                      "FlexAttention.Config -> DenseMaskAttention.Config") for i in range(2)]
    text.append(line(step_msg(1, 7.0)))
    text += [line(f"[OverrideCalls] {who}: calls=4 fallbacks=0 modules=2 rank=0 step=1") for who in (name, mine)]
    text += [line(step_msg(2, 6.9)), line("Training completed")]
    p = tmp_path / "train.log"
    p.write_text("".join(text))
    doc = json.loads(cli("inspect-logs", str(p), "--json").out)
    said = {f["code"]: [] for f in doc["findings"]}
    for f in doc["findings"]:
        said[f["code"]].append(f["message"])
    ran = said["override-ran"]
    assert any(f"override {name} (trnqwen's CPU attention, put in on every CPU run) ran" in m for m in ran), ran
    assert any(m.startswith(f"override {mine} ran") for m in ran), ran  # the user's own: as before
    table = cli("inspect-logs", str(p)).out
    assert "trnqwen's CPU attention" in table, table
