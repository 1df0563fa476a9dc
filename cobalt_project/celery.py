"""The Celery application of team mode. Workers start with `cobalt worker`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cobalt_project.settings")

app = Celery("cobalt")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["cobalt_app"])
