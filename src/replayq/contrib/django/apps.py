"""The Django app config: ``INSTALLED_APPS += ["replayq.contrib.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class ReplayqConfig(AppConfig):
    """Makes ``manage.py replayq_worker`` available; replayq has no Django models."""

    name = "replayq.contrib.django"
    label = "replayq"
    verbose_name = "replayq"
