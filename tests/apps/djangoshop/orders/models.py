"""The business row that a job is enqueued with."""

from django.db import models


class Order(models.Model):
    status = models.CharField(max_length=20)

    class Meta:
        app_label = "orders"
