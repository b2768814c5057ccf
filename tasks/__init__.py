"""Celery app and tasks: thin wrappers that call one lifecycle function each."""
