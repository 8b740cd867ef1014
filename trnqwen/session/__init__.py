"""What one command asks for, carried out by the library: the run policy above the launcher.

``session/`` sits above ``train/`` (planning and launching) and ``evaluate/`` (the evaluation a
fine-tune ends with), which it joins, and below ``cli/`` and ``quickstart/``, which call it.
"""
