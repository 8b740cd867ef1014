"""Data shipped with trnqwen: the tiny corpus (``tiny_corpus/``) and the recipe that writes it."""
