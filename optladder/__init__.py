"""optladder: config-driven experiments and A/B rollout gates for LLM inference optimizations.

The command is `optladder` (optladder/cli.py); the design, the import rule and the metric contract are in
docs/design.md."""
__version__ = "0.1.0"
