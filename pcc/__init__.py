"""pcc: the precision-contract compiler for LLM reinforcement learning."""

__version__ = "0.1.0"
