"""Supervised fine-tuning: the answers of chat records (or every token of text) are the targets.

SFT is the house's default: its loss is the trainers' own next-token loss, its data the chat
formats of :mod:`trnqwen.dataset`, its metrics the core ones of the metrics stream.  So it
declares no settings, no hooks and no metrics of its own.
"""

from trnqwen.methods.base import Method

METHOD = Method(
    name="sft",
    help="supervised: answers are targets",
    data="chat",
    docs="docs/getting-started.md",
)
