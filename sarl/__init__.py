"""SARL: structure-aware reinforcement learning for reasoning LLMs."""

__version__ = "0.1.0"
