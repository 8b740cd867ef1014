"""Test double of the legacy, XLA-based torch-neuronx (2.9.0.2.15.x): no native `neuron` device."""

__version__ = "2.9.0.2.15.1"
