"""The contract between trnqwen's launcher side and its ranks, below every other package.

What both sides of a run must agree on lives here and nowhere else: the specs the launcher
hands the ranks, the record and line formats the ranks write and the launcher, status line and
``inspect-logs`` read, and the checkpoint folder's layout.  ``train/``, ``runtime/``, ``logs/``,
``ckpt/`` and the method folders import this package; it imports none of them (nothing heavy
either: the launcher and the ranks both load it).
"""
