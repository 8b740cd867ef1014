"""``trnqwen fetch``: Hub snapshots that arrive whole, and the built-in tiny Qwen3.

``plan`` (commit, vetted file list) -> ``download`` (disk check, huggingface_hub, the
:func:`~trnqwen.fetch.download.fetch` entry point) -> ``verify`` (sizes, hashes, headers, the
manifest); ``errors`` maps Hub failures to one line each; ``builtin`` writes
``builtin:tiny-qwen3`` offline.  Nothing here imports huggingface_hub or torch at import time.
"""
