"""Training of the embedded default models (``suffixspec/demo-target`` and ``suffixspec/demo-draft``).

Run ``python -m suffixspec.training.train_default_models --out suffixspec/default_models``.
"""
