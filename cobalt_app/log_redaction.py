"""Logs pass the one redaction: a `logging.Filter` on the handlers Cobalt's loggers write to.

Installed by the settings' LOGGING (the `stderr` handler of the `cobalt` loggers), on the
handlers Celery sets up for `cobalt worker`, on `cobalt mcp`'s stderr handlers and on
`cobalt serve`'s request log. A record's message (its arguments merged in), its traceback
and its stack are redacted before any handler formats them (`storable.redacted`: names,
shapes, URLs' credentials and the process's secret environment values).
"""

from __future__ import annotations

import logging
from typing import Any

from cobalt_app.storable import redacted

_FORMATTER = logging.Formatter()


class RedactingFilter(logging.Filter):
    """Hides secrets in a record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redacted(record.getMessage())
        record.args = ()
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redacted(record.exc_text)
        if record.stack_info:
            record.stack_info = redacted(record.stack_info)
        return True


def redact_handlers(logger: logging.Logger | None = None, **_: Any) -> None:
    """Add the filter to every handler of `logger` (the root logger when None) that has none
    (also a receiver of Celery's `after_setup_logger` / `after_setup_task_logger`)."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def redacting(handler: logging.Handler) -> logging.Handler:
    """`handler` with the filter added, returned (for handlers built in code)."""
    handler.addFilter(RedactingFilter())
    return handler
