"""Training: recipes (config for each backend), the torchrun launcher, preflight, run supervision.

``trnqwen.train`` is core library (no typer).  Code that runs *inside* torchrun ranks lives in
``trnqwen.runtime`` and is the only place that imports torchtitan at module level.
"""
