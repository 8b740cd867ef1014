"""The lifecycle for real on CPU: fine-tune the tiny Qwen3 on the bundled chat set (torchrun,
torchtitan native, a seeded validation split, TensorBoard on), then `trnqwen eval` with no
arguments: the tuned held-out loss is below the base's, it equals torchtitan's own validator on the
same split, the answers repeat exactly, and the export is a whole model folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import run_subprocess

pytestmark = pytest.mark.slow

STEPS = 6


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    from trnqwen.fetch.builtin import chat_path

    work = tmp_path_factory.mktemp("eval_e2e")
    env = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(work / "cache")}
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", cwd=work, env=env, timeout=300)
    assert fetched.code == 0, fetched.text
    run = run_subprocess(
        "train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1", "--backend", "native",
        "--steps", str(STEPS), "--seq-len", "128", "--local-batch-size", "2", "--lr", "3e-3", "--finetune",
        "--dataset", str(chat_path()), "--val-split", "0.1", "--val-every", str(STEPS), "--tensorboard",
        cwd=work, env=env, timeout=900,
    )
    assert run.code == 0, run.text[-4000:]
    return work, env, run


def test_finetune_ends_with_the_before_after_line(chat_run):
    work, env, run = chat_run
    lines = run.err.splitlines()
    line = next(ln for ln in lines if ln.startswith("validation loss before"))
    before, after = (float(x) for x in line.split("before ")[1].split(" (")[0].split(" -> after "))
    assert after < before
    # no silent stretch (issue 34 item 15): each step line has tqdm's [elapsed<left, s/step], the last
    # one says the ranks export next, and the closing eval says it starts before its result
    status = [ln for ln in lines if ln.startswith("step ")]
    assert len(status) == STEPS and all(re.search(r"  \[\d+:\d\d<(\d+:\d\d|\?), [\d.e+-]+ s/step\]", ln) for ln in status[1:]), status
    assert re.search(r"<0:00, [\d.e+-]+ s/step\]  exporting HF safetensors \.\.\.$", status[-1]), status[-1]
    closing = next(i for i, ln in enumerate(lines) if ln.startswith("closing eval: validation loss of the base and of step-"))
    assert closing < lines.index(line)


def test_eval_with_no_arguments_scores_the_validation_split_like_the_validator(chat_run):
    from trnqwen.contract.stepline import parse_validation_line

    work, env, _ = chat_run
    first = run_subprocess("eval", "--json", "--generate", "2", "--max-new-tokens", "12", cwd=work, env=env, timeout=600)
    assert first.code == 0, first.text
    doc = json.loads(first.out)
    base, tuned = doc["results"]
    assert base["checkpoint"] == "base" and tuned["loss"] < base["loss"] and tuned["delta_vs_base"] < 0
    assert doc["dataset"].endswith("validation split")
    # torchtitan's validator scored the same val split at the last step: the same number
    run_dir = next(p for p in (work / ".trnqwen" / "runs").iterdir() if (p / "run.json").is_file())
    validations = [v for v in map(parse_validation_line, (run_dir / "train.log").read_text().splitlines()) if v]
    assert validations and validations[-1]["loss"] == pytest.approx(tuned["loss"], rel=2e-4)
    # greedy answers repeat exactly
    again = run_subprocess("eval", "--json", "--generate", "2", "--max-new-tokens", "12", cwd=work, env=env, timeout=600)
    assert again.code == 0, again.text
    assert json.loads(again.out)["generations"] == doc["generations"] and len(doc["generations"]) == 2
    # results went where users look: eval.json, the TensorBoard events, the model card
    assert json.loads((run_dir / "eval.json").read_text())["results"] == doc["results"]
    assert list((run_dir / "tb" / "eval").glob("events.out.tfevents.*"))
    export = Path(json.loads((run_dir / "run.json").read_text())["extra"]["exported"])
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (export / name).is_file(), name
    assert "Held-out evaluation" in (export / "README.md").read_text()
    logs = run_subprocess("inspect-logs", str(run_dir), "--json", cwd=work, env=env, timeout=300)
    assert logs.code == 0, logs.text
    assert json.loads(logs.out)["evaluation"]["results"] == doc["results"]  # inspect-logs shows eval.json
