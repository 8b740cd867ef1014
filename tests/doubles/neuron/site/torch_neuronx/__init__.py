"""Test double of the native TorchNeuron package (torch-neuronx 2.14.3.0).

Like the real one, ``__version__`` is a placeholder: the installed version is in the
distribution metadata (``importlib.metadata.version("torch-neuronx")``).  Unlike the real one it
imports no torch and touches no device, so the probe's subprocess stays cheap.
"""

__version__ = "0.0.0+placeholder"

from torch_neuronx import utils  # noqa: E402,F401
