"""The REST API of API.md (FastAPI); ``broker.api:app`` is the ASGI app for uvicorn."""

from broker.api.app import app, create_app

__all__ = ["app", "create_app"]
