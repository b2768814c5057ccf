"""Celery app and tasks: thin wrappers that call one service function each.

``celery -A tasks worker`` and ``celery -A tasks beat`` find ``tasks.app``.
"""

from tasks.celery_app import app

__all__ = ["app"]
