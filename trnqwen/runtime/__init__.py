"""Code that runs INSIDE torchrun ranks (never in the launcher process).

``python -m trnqwen.runtime.entry`` is the rank entry point: on CPU it installs the device
shims torchtitan needs (device selection, a CPU attention with a backward, sum reductions for
FSDP over gloo) before any other torchtitan import, then hands over to ``torchtitan.train``.
On CUDA and Neuron it is a thin pass-through.  This package is the only place in trnqwen that
imports torchtitan at module level.
"""
