"""Vocabulary translation between tokenizers (universal assisted generation). No model code, no flask."""
