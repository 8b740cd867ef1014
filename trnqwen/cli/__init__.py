"""The thin Typer layer: one module per command, shared options in ``_options``.

Nothing in ``trnqwen.cli`` does real work: commands parse flags, call the core
library and render its result.
"""
