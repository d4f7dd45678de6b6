"""Logging: ``--log-level``, ``--log-format text|json``, and job fields on every record.

While a worker runs an attempt, every log record made on that thread (by
replayq or by the handler's own loggers) carries ``job_id``, ``trace_id``,
``attempt``, ``version``, ``job_type`` and ``worker_id``: a context variable
set around the attempt, copied onto records by a filter on the handler. The
JSON format writes one object per line with those fields at the top level;
the text format appends them as ``key=value``.

Every line is redacted (``replayq.redaction``) with the rules of the record's
job type once a worker named them (``redact_with``), the defaults before that.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from replayq.model import Job
from replayq.redaction import Redactor

JOB_FIELDS = ("job_id", "trace_id", "attempt", "version", "job_type", "worker_id")
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

_current: contextvars.ContextVar[job_fields | None] = contextvars.ContextVar(
    "replayq_job_fields", default=None
)


_chooser: list[Callable[[str | None], Redactor]] = []


def redact_with(choose: Callable[[str | None], Redactor]) -> None:
    """Redact log lines with ``choose(job_type)`` (``None`` outside an attempt)."""
    _chooser[:] = [choose]


def _redact(record: logging.LogRecord, text: str) -> str:
    if not _chooser:
        _chooser.append(_default_redactor())
    return _chooser[0](getattr(record, "job_type", None)).text(text)


def _default_redactor() -> Callable[[str | None], Redactor]:
    default = Redactor.build()
    return lambda _job_type: default


class job_fields:  # a function to its callers: ``with job_fields(job, worker_id):``
    """Records logged inside this block (on this thread) carry the job's fields.

    A class rather than a ``@contextmanager`` generator: it wraps every attempt, and the
    generator's making, entering and leaving cost a no-op job several microseconds. The
    fields are read off the (immutable) job when a record is logged, not built per attempt:
    most attempts log nothing."""

    __slots__ = ("_job", "_token", "_worker_id")

    def __init__(self, job: Job, worker_id: str) -> None:
        self._job = job
        self._worker_id = worker_id

    def fields(self) -> dict[str, Any]:
        """The fields a record logged inside this block carries (``JOB_FIELDS``)."""
        job = self._job
        return {
            "job_id": job.id,
            "trace_id": job.trace_id,
            "attempt": job.attempt,
            "version": job.handler_version,
            "job_type": job.job_type,
            "worker_id": self._worker_id,
        }

    def __enter__(self) -> None:
        self._token = _current.set(self)

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


class JobFieldsFilter(logging.Filter):
    """Copies the current attempt's fields onto each record (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _current.get()
        if current is not None:
            for name, value in current.fields().items():
                if not hasattr(record, name):
                    setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, job fields."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _redact(record, record.getMessage()),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                body[name] = value
        if record.exc_info:
            body["exception"] = _redact(record, self.formatException(record.exc_info))
        return json.dumps(body, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value…`` with the job fields that are set."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(
            f"{name}={getattr(record, name)}"
            for name in JOB_FIELDS
            if getattr(record, name, None) is not None
        )
        return _redact(record, f"{line} {extra}" if extra else line)


def configure_logging(
    level: str = "info",
    fmt: str = "text",
    stream: TextIO | None = None,
    *,
    redact: Callable[[str | None], Redactor] | None = None,
) -> logging.Handler:
    """Configure the root logger once for a long-running command; returns its handler.

    ``redact``: the rules of a job type (``None``: outside an attempt) to redact each
    line with, as ``App.runtime.redactor_for`` gives them; default: the built-in rules
    until a worker names its app's."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    if redact is not None:
        redact_with(redact)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(JobFieldsFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_replayq", False)]:
        root.removeHandler(old)
    handler._replayq = True  # type: ignore[attr-defined]  # ours to replace on reconfigure
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
