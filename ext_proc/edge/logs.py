"""JSON-lines logging, configured once by the command line."""

from __future__ import annotations

import logging
import select
import sys
import time
from collections.abc import Mapping
from typing import Final, TextIO

import orjson

# Attributes every LogRecord has; anything else was passed through ``extra``.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


# Each millisecond's end of a line's time, made once.
_MILLIS: Final = tuple(f".{millis:03d}Z" for millis in range(1000))


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def _time(self, created: float) -> str:
        # A decision line is written per request but an allow without ids: the date
        # part is rendered once per second.
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        millis = int((created - second) * 1000)
        if 0 <= millis < 1000:  # always, for a time after 1970: one lookup, no formatting
            return self._stamp + _MILLIS[millis]
        return f"{self._stamp}.{millis:03d}Z"

    def line(
        self,
        created: float,
        level: str,
        logger: str,
        message: str,
        fields: Mapping[str, object],
        *,
        exception: str | None = None,
    ) -> str:
        """One log line: the time, level, logger and message, then ``fields``."""
        line: dict[str, object] = {
            "time": self._time(created),
            "level": level,
            "logger": logger,
            "message": message,
        }
        line.update(fields)
        if exception:
            line["exception"] = exception
        # orjson: a decision line is written per request but an allow without ids.
        return orjson.dumps(line, default=str).decode()

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        exception = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created,
            record.levelname.lower(),
            record.name,
            record.getMessage(),
            fields,
            exception=exception,
        )


# Lines handed to the handler by ``info`` are written in batches: once the first has
# waited this long, once this many wait, and whenever ``flush`` runs (the server calls it
# every second, logging at exit). Envoy's access log is flushed every second alike.
FLUSH_SECONDS: Final = 1.0
BATCH_LINES: Final = 256


# A line handed to ``JsonHandler.write_line``: when it was made, its logger, message
# and fields, formatted when its batch is written.
_Waiting = tuple[float, str, str, Mapping[str, object]]


class JsonHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes JSON lines to a stream. Lines from ``info`` are batched: one system call
    per 4 KiB of lines instead of one per line, which is most of what a line costs, and
    formatted as their batch is written (one pass over the batch, none on the request's
    way). Any other record is written at once, after the lines waiting before it."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pending: list[_Waiting] = []
        self._first = 0.0  # when the oldest waiting line was made

    def write_line(self, logger: str, message: str, fields: Mapping[str, object]) -> None:
        """Hand over an INFO line; ``fields`` is read when the line is written (its
        time is now's), so the caller changes it no more."""
        now = time.time()
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            if not self._pending:
                self._first = now
            self._pending.append((now, logger, message, fields))
            if len(self._pending) >= BATCH_LINES or now - self._first >= FLUSH_SECONDS:
                self._write_pending()

    def _lines(self) -> list[str]:
        """The waiting lines, formatted (the caller holds the lock). A line that cannot
        be formatted (fields orjson refuses) is reported the way logging reports a
        failed record, and the others are written."""
        formatter = self.formatter
        if not isinstance(formatter, JsonFormatter):  # replaced since: as ``info`` wrote
            formatter = JsonFormatter()
        lines = []
        for created, logger, message, fields in self._pending:
            try:
                lines.append(formatter.line(created, "info", logger, message, fields))
            except Exception:  # noqa: BLE001 - logging never raises into its caller
                self.handleError(logging.makeLogRecord({"msg": message, "created": created}))
        return lines

    def _write_pending(self) -> None:
        """Write the waiting lines (the caller holds the lock), in writes of whole lines
        of at most ``PIPE_BUF`` bytes: a pipe takes such a write in one piece, so the
        lines of several workers sharing one never interleave. A stream that fails loses
        the lines, reported the way logging reports a failed record; the caller is not
        disturbed."""
        if not self._pending:
            return
        chunk: list[str] = []
        size = 0
        for line in self._lines():
            length = (len(line) if line.isascii() else len(line.encode())) + 1
            if chunk and size + length > select.PIPE_BUF:
                self._write(chunk)
                chunk, size = [], 0
            chunk.append(line)
            size += length
        self._pending.clear()
        if chunk:
            self._write(chunk)

    def _write(self, lines: list[str]) -> None:
        """One write of ``lines``, flushed at once: each chunk is its own system call."""
        text = self.terminator.join(lines) + self.terminator
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging never raises into its caller
            self.handleError(logging.makeLogRecord({"msg": text}))

    def emit(self, record: logging.LogRecord) -> None:
        with self.lock:  # type: ignore[union-attr]  # an RLock: handle() holds it already
            self._write_pending()
        super().emit(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_pending()
        super().flush()


def flush() -> None:
    """Write every batched line now."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def _sole_handler(logger: logging.Logger) -> JsonHandler | None:
    """The JSON handler when it is the only one an INFO line of ``logger`` reaches,
    with no filter on the way; None otherwise (another handler, a filter, a formatter
    of someone else's: the line then takes the logging machinery)."""
    found: JsonHandler | None = None
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters:
            return None
        for handler in node.handlers:
            if (
                found is not None
                or type(handler) is not JsonHandler
                or handler.filters
                or handler.level > logging.INFO
                or type(handler.formatter) is not JsonFormatter
            ):
                return None
            found = handler
        node = node.parent if node.propagate else None
    return found


def info(logger: logging.Logger, message: str, fields: Mapping[str, object]) -> None:
    """``logger.info(message, extra=fields)``, for lines written per request (decisions).
    When the line reaches the JSON handler alone, it is handed to it directly, the same
    line without a LogRecord or the handler chain (a quarter of the cost), and batched
    (``JsonHandler``): ``fields`` is then read when the batch is written, so the caller
    hands it over and changes it no more."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _sole_handler(logger)
    if handler is None:
        logger.info(message, extra=fields)
    else:
        handler.write_line(logger.name, message, fields)


def configure(level: str) -> None:
    # No line shows the caller's source location, thread or process: skip finding them
    # for every record (a stack walk per decision line).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = JsonHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
