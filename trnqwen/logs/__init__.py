"""Reading and judging training logs (``trnqwen inspect-logs``).

``stream`` reads a run's metrics stream (steps and validations, every value by name), ``engine``
turns log lines into records, ``judge`` turns a parsed
run into findings, ``report`` renders tables/JSON/CSV, ``plot`` the curves.
"""
