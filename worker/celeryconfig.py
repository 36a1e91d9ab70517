"""The worker process's Celery settings, read from FLIPGATE_* when Celery first needs them."""

from service.config import get_settings
from service.queue import celery_config

globals().update(celery_config(get_settings()))
