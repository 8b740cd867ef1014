"""The recipe that writes ``tiny_sums/``: GRPO's bundled verifiable task.

Small sums as TRL prompt records (a one-message conversation asking for the number only) with the
answer in an ``answer`` column, which reaches the reward functions.  ``sums.jsonl`` is the training
set, ``sums_heldout.jsonl`` the held-out prompts a run is measured on.  The task's reward is
:func:`trnqwen.methods.grpo.task.number` (partial credit for answering in digits, full credit for
the right number), so even the built-in random-init tiny Qwen3 gets measurably better at it in a
few steps.  Fully determined by the seed.

Regenerate (the files are committed; a test checks they match this recipe):

    python -m trnqwen.data.sums_recipe        # rewrites trnqwen/data/tiny_sums/
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261204
SUMS_DIR = Path(__file__).resolve().parent / "tiny_sums"
TRAIN_NAME, HELDOUT_NAME = "sums.jsonl", "sums_heldout.jsonl"
TRAIN, HELDOUT = 48, 16


def records(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out = []
    while len(out) < TRAIN + HELDOUT:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}],
                    "answer": str(a + b)})
    return out


def texts(seed: int = SEED) -> dict[str, str]:
    rows = records(seed)
    dump = lambda part: "".join(json.dumps(r) + "\n" for r in part)  # noqa: E731
    return {TRAIN_NAME: dump(rows[:TRAIN]), HELDOUT_NAME: dump(rows[TRAIN:])}


def sums_path(name: str = TRAIN_NAME) -> Path:
    return SUMS_DIR / name


def main() -> int:
    SUMS_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in texts().items():
        (SUMS_DIR / name).write_text(text)
    print(f"wrote {SUMS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
