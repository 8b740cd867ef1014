"""``torch_neuronx.utils`` as documented: the LNC setting as a string."""

import os


def get_logical_neuron_cores() -> str:
    """``NEURON_LOGICAL_NC_CONFIG`` if set, else the trn2 default "2"."""
    return str(os.environ.get("NEURON_LOGICAL_NC_CONFIG") or "2")
