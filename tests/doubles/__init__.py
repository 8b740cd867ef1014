"""Test doubles of things this machine does not have (Neuron devices and tools, NVIDIA GPUs).

Each answers like the documented real one (see ../shared/reference/neuron-facts.md) so the
code under test runs its real parsing and decisions against them.
"""
