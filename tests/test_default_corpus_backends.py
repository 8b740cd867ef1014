"""Without ``--dataset`` every backend reads the same rows of the model's default corpus.

The torchtitan backends stream the corpus through torchtitan's ``HuggingFaceTextDataset`` (packed,
split over the data-parallel ranks); hf-trainer used to pad each document to ``seq_len`` instead,
so its losses were 3-7% off theirs step by step (the quickstart's lanes disagreed).  It now reads
the corpus with the same torchtitan reader: from the same weights, 2 ranks each, the step losses
of native and hf-trainer agree to float32 rounding.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import replace_weights, run_subprocess

pytestmark = pytest.mark.slow

SEQ, STEPS = 64, 4


def _pretrained(root: Path) -> Path:
    """A tiny Qwen3 that has seen the corpus for a few steps (in-process): a random-init model's
    loss is about ln(vocab) whatever it reads, so it could not tell the rows apart."""
    import torch
    from transformers import AutoModelForCausalLM

    from trnqwen.fetch.builtin import write_tiny_qwen3
    from trnqwen.runtime.hf_trainer_data import StreamedRows

    tiny = write_tiny_qwen3(root / "random" / "tiny-qwen3")
    dest = root / "assets" / "tiny-qwen3"
    shutil.copytree(tiny, dest)
    rows = iter(StreamedRows(None, assets_dir=str(dest), model_is_builtin=True, seq_len=SEQ, rank=0, world=1))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(20):
        batch = [next(rows) for _ in range(4)]
        stacked = {k: torch.stack([b[k] for b in batch]) for k in batch[0]}
        model(**stacked).loss.backward()
        opt.step()
        opt.zero_grad()
    return replace_weights(model, dest)


def _losses(cwd: Path) -> dict[int, float]:
    from trnqwen.contract.stepline import parse_step_line
    from trnqwen.rundir import last_run_dir

    text = (last_run_dir(cwd / ".trnqwen" / "runs") / "train.log").read_text()
    return {m["step"]: m["loss"] for m in map(parse_step_line, text.splitlines()) if m}


def test_native_and_hf_trainer_see_the_same_corpus_rows(tmp_path):
    assets = _pretrained(tmp_path)
    losses = {}
    for backend in ("native", "hf-trainer"):
        cwd = tmp_path / backend
        cwd.mkdir()
        r = run_subprocess(
            "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--device", "cpu", "--finetune",
            "--nproc-per-node", "2", "--steps", str(STEPS), "--seq-len", str(SEQ), "--lr", "1e-3", "--warmup", "1",
            "--backend", backend, "--no-export-hf", "--json", cwd=cwd, timeout=600,
        )
        assert r.code == 0, (backend, r.err[-3000:])
        losses[backend] = _losses(cwd)
    native, hf = losses["native"], losses["hf-trainer"]
    assert sorted(native) == sorted(hf) == list(range(1, STEPS + 1)), losses
    for step in native:
        assert abs(hf[step] - native[step]) / native[step] < 1e-5, (step, losses)
