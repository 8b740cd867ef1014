"""What machine is this: device detection, the check-env probe, known-good package versions.

``device`` (which device a run gets) is what the launcher needs; ``probe`` (the full check-env
report) builds on it and never the reverse.  Nothing here initializes a device runtime.
"""
