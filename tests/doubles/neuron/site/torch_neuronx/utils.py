"""``torch_neuronx.utils`` as documented: LNC as a string, the platform target from the instance."""

import os
import re
from pathlib import Path


def get_logical_neuron_cores() -> str:
    """``NEURON_LOGICAL_NC_CONFIG`` if set, else the instance default (trn2/trn3: "2")."""
    value = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
    if value:
        return str(value)
    return "1" if get_platform_target() == "trn1" else "2"


def get_platform_target() -> str:
    root = Path(os.environ.get("TRNQWEN_SYSFS_ROOT", "/"))
    try:
        product = (root / "sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        product = "trn2.48xlarge"
    m = re.match(r"(trn\d)", product)
    return m.group(1) if m else "trn2"
