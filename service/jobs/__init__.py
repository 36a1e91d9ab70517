"""Background jobs (inference, metrics, training) and their progress: states (service), the jobs
they wait for and how they are queued and sent (enqueue, on top of service.celery_app). What
follows a job's end is decided in service.flows."""
