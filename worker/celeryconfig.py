"""The worker process's Celery settings, read from FLIPGATE_* when Celery first needs them."""

from service.celery_app import celery_config
from service.config import get_settings

globals().update(celery_config(get_settings()))
