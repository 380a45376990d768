"""sglang-replayssm: ReplaySSM decode and speculative verify for SGLang hybrid SSM models."""

__version__ = "0.1.0"
