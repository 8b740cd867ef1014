"""Training methods, one folder each (``sft/``, ``dpo/``), named by :mod:`trnqwen.methods.registry`.

What a method declares is :class:`trnqwen.methods.base.Method`; docs/architecture.md says where a
new one goes.  Layering: a method may import ``contract/``, the base modules (config, errors...),
``dataset/`` and ``runtime/``; never ``train/``, ``logs/``, ``ckpt/``, ``evaluate/``,
``quickstart/`` or ``cli/`` (they read the methods, not the other way round), and ``runtime/``
never imports a method (the ranks reach its hooks by the dotted path in their spec).
"""
