"""Packaging glue that pyproject.toml cannot express (everything else lives there).

index/, tokenizer_bridge/, bench/ and web/ sit at the repository root, but a wheel must not
install top-level packages of those names (``index`` and ``bench`` especially clash with other
projects' modules): they install as ``suffixspec.index``, ``suffixspec.tokenizer_bridge``,
``suffixspec.bench`` and ``suffixspec.web``, so ``suffixspec`` is the wheel's only top-level name.
pyproject's ``packages.find`` cannot rename a folder, so the package list is built here.
"""

from setuptools import find_packages, setup

_RENAMED = {"index": "suffixspec.index", "tokenizer_bridge": "suffixspec.tokenizer_bridge",
            "bench": "suffixspec.bench", "web": "suffixspec.web"}

setup(
    packages=[*find_packages(include=["suffixspec", "suffixspec.*"]),
              *[f"{name}{sub[len(folder):]}" for folder, name in _RENAMED.items()
                for sub in [folder, *find_packages(where=".", include=[f"{folder}.*"])]]],
    package_dir={name: folder for folder, name in _RENAMED.items()},
)
