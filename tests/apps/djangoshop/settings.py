"""A small real Django project whose database comes from the environment (SQLite or PostgreSQL).

DJANGOSHOP_DB is ``sqlite:///path`` or a ``postgresql://…?options=-csearch_path%3Dschema`` URL.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit

SECRET_KEY = "test-only"
USE_TZ = True
INSTALLED_APPS = ["orders", "replayq.contrib.django"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
REPLAYQ_APP = "orders.jobs:app"


def database(url: str) -> dict[str, object]:
    if url.startswith("sqlite:///"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": url.removeprefix("sqlite:///")}
    parts = urlsplit(url)
    options = {k: unquote(v[-1]) for k, v in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "HOST": parts.hostname or "",
        "PORT": parts.port or "",
        "OPTIONS": options,
    }


DATABASES = {"default": database(os.environ["DJANGOSHOP_DB"])}
