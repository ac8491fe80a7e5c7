"""Training of the embedded default models (``suffixspec/demo-target`` and ``suffixspec/demo-draft``).

Not part of the installed package: run from the repository root,
``python -m tools.training.train_default_models --ckpt-dir CKPT --out suffixspec/default_models``.
"""
