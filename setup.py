"""Packaging glue that pyproject.toml cannot express (everything else lives there).

bench/ and web/ sit at the repository root (``python -m bench.run`` works in a checkout), but a
wheel must not install top-level packages named ``bench`` and ``web``, which clash with other
projects' modules of those names: they install as ``suffixspec.bench`` and ``suffixspec.web``.
pyproject's ``packages.find`` cannot rename a folder, so the package list is built here.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["suffixspec", "suffixspec.*", "index", "index.*",
                                      "tokenizer_bridge", "tokenizer_bridge.*"]),
              "suffixspec.bench", "suffixspec.web"],
    package_dir={"suffixspec.bench": "bench", "suffixspec.web": "web"},
)
