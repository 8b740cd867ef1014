"""Settings that cannot make a sensible run are refused up front, naming the bound (issue 34 item 24).

* a LoRA rank above a target layer's size (the update of a 128 -> 64 projection has rank 64 at
  most: the rest of the adapter is parameters that add nothing);
* IPO with a beta whose step-1 loss (1 / (2 beta))^2 is absurd (1e-12 planned 2.5e23).

(An empty DPO prompt is refused with the other bad records in tests/test_dpo.py.)
"""

from __future__ import annotations

import json

from tests.helpers import assert_clean_error

TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1", "--steps", "2", "--seq-len", "128",
        "--finetune", "--backend", "native"]


def test_a_lora_rank_above_a_layers_size_is_refused(cli, in_tmp, tiny_assets):
    # the tiny model: hidden 128, 2 KV heads x 32 -> k_proj and v_proj are 128 -> 64
    args = [*TINY, "--assets", str(tiny_assets), "--lora"]
    plan = json.loads(cli("train", *args, "--lora-rank", "100", "--dry-run", "--json").out)
    (found,) = [f for f in plan["preflight"]["findings"] if f["check"] == "lora" and f["severity"] == "error"]
    assert "k_proj (128 -> 64)" in found["message"] and "v_proj (128 -> 64)" in found["message"]
    assert "--lora-rank 64 or less" in found["hint"]
    assert_clean_error(cli("train", *args, "--lora-rank", "100"), code=2, contains="above the size of k_proj")
    assert not (in_tmp / ".trnqwen").exists()
    # k and v left out: the rank fits every other target (q/o 128 -> 128, the MLP 128 <-> 384)
    fine = json.loads(cli("train", *args, "--lora-rank", "100", "--lora-targets", "q_proj,o_proj,up_proj",
                          "--dry-run", "--json").out)
    assert not [f for f in fine["preflight"]["findings"] if f["check"] == "lora" and f["severity"] == "error"]


def test_ipo_with_a_beta_that_makes_the_loss_absurd_is_refused(cli, in_tmp, tiny_assets):
    args = [*TINY, "--assets", str(tiny_assets), "--method", "dpo", "--dpo-loss", "ipo"]
    r = cli("train", *args, "--beta", "1e-12", "--dry-run")
    assert_clean_error(r, code=2, contains="starts at loss (1 / (2 beta))^2 = 2.5e+23")
    assert "--beta 0.0005 or more" in r.err
    ok = cli("train", *args, "--beta", "0.01", "--dry-run", "--json")
    assert ok.code == 0, ok.text
