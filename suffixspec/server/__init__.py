"""The HTTP service: an OpenAI-compatible Flask app over one engine worker.

    from suffixspec.server import create_app, ServerConfig
    app = create_app(ServerConfig(model="path/to/model", api_key="secret"))

``suffixspec serve`` runs it under waitress (see ``suffixspec.server.serve``). ``create_app`` and
``ServerState`` are imported on first use, so ``suffixspec.server.config`` (the settings and their
defaults, which the CLI's options show) loads without Flask.
"""

from __future__ import annotations

from typing import Any

from suffixspec.server.config import ServerConfig

__all__ = ["ServerConfig", "ServerState", "create_app"]


def __getattr__(name: str) -> Any:
    if name in ("ServerState", "create_app"):
        from suffixspec.server import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
