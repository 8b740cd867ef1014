"""GRPO: group relative policy optimisation (the METHOD declaration is added by the method's integration)."""
