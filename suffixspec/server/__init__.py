"""The HTTP service: an OpenAI-compatible Flask app over one engine worker.

    from suffixspec.server import create_app, ServerConfig
    app = create_app(ServerConfig(model="path/to/model", api_key="secret"))

``suffixspec serve`` runs it under waitress (see ``suffixspec.server.serve``).
"""

from .app import ServerState, create_app
from .config import ServerConfig

__all__ = ["ServerConfig", "ServerState", "create_app"]
