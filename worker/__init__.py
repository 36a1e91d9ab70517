"""Celery app and thin tasks: job ids in, service and flipgate code run, results persisted."""
