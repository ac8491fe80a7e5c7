"""``--model``'s help on every command that takes one names every model of the registry
(suffixspec/models.py), so a model registered there is one a user finds in ``--help``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from suffixspec.cli import main
from suffixspec.models import KNOWN_MODELS


@pytest.mark.parametrize("command", [["generate"], ["serve"], ["bench"], ["index", "add"]])
def test_model_help_names_every_registered_model(command):
    res = CliRunner().invoke(main, [*command, "--help"], terminal_width=10_000, max_content_width=10_000)
    assert res.exit_code == 0, res.output
    line = next(line for line in res.output.splitlines() if line.strip().startswith("--model"))
    missing = [name for name in KNOWN_MODELS if name not in line]
    assert not missing, (command, missing, line)
    assert len(KNOWN_MODELS) >= 4  # SmolLM2, Gemma 3 270M and the Qwen coder pair at least
