import io
import json
import logging
import re
import select
import time

import pytest

from ext_proc.edge import logs
from ext_proc.edge.logs import JsonFormatter


def record(created: float) -> logging.LogRecord:
    made = logging.makeLogRecord(
        {"name": "ext_proc.decision", "msg": "decision", "levelno": 20, "levelname": "INFO"}
    )
    made.created, made.msecs = created, (created - int(created)) * 1000
    made.route = "aggregated"
    return made


def test_lines_carry_the_time_to_the_millisecond_and_the_extra_fields():
    formatter = JsonFormatter()
    # Within one second, across a second and back: the cached date part never goes stale.
    for created in (1_700_000_000.123, 1_700_000_000.999, 1_700_000_001.0, 1_700_000_000.5):
        line = json.loads(formatter.format(record(created)))
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        assert line["time"] == f"{expected}.{int((created - int(created)) * 1000):03d}Z"
        assert line["level"] == "info"
        assert line["message"] == "decision"
        assert line["route"] == "aggregated"


@pytest.mark.parametrize(
    "created",
    [
        *(1_700_000_000 + k / 1000 for k in range(1000)),
        *(1_700_000_000 + k / 1000 - 1e-7 for k in range(1, 1001)),
        1_700_000_000.9999999,
        0.0,
        0.0005,
        4_102_444_800.999,
    ],
)
def test_the_milliseconds_are_the_truncated_fraction_of_the_second(created):
    formatter = JsonFormatter()
    expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    assert formatter._time(created) == f"{expected}.{int((created - int(created)) * 1000):03d}Z"


@pytest.fixture
def configured(monkeypatch):
    """logs.configure() writing to a buffer; the root logger restored afterwards. Call
    ``alone()`` first in the test: pytest adds its own handler for the test's call."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    logs.configure("info")
    yield buffer
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def alone():
    """The JSON handler as the root logger's only one (as the command line leaves it)."""
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if type(h) is logs.JsonHandler]


FIELDS = {"request_id": "r-1", "route": "aggregated", "action": "strip", "id_count": 3}


def lines(buffer):
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_info_writes_what_the_logging_machinery_writes(configured):
    alone()
    log = logging.getLogger("ext_proc.decision")
    logs.info(log, "decision", FIELDS)
    log.info("decision", extra=FIELDS)
    fast, slow = lines(configured)
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    assert stamp.fullmatch(fast.pop("time"))
    assert stamp.fullmatch(slow.pop("time"))
    expected = {"level": "info", "logger": "ext_proc.decision", "message": "decision"}
    assert fast == slow == {**expected, **FIELDS}


def test_info_goes_through_logging_when_another_handler_or_a_filter_is_on_the_way(configured):
    alone()
    log = logging.getLogger("ext_proc.decision")
    seen = []
    extra = logging.Handler()
    extra.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(extra)
    logs.info(log, "decision", FIELDS)
    assert [r.route for r in seen] == ["aggregated"]
    logging.getLogger().removeHandler(extra)
    second = logs.JsonHandler(io.StringIO())
    second.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(second)
    logs.info(log, "decision", FIELDS)
    assert [line["route"] for line in lines(second.stream)] == ["aggregated"]
    logging.getLogger().removeHandler(second)
    log.addFilter(lambda record: False)
    try:
        logs.info(log, "decision", FIELDS)
    finally:
        log.filters.clear()
    logs.flush()
    assert len(lines(configured)) == 2  # the filter dropped the third line


def test_info_respects_the_level(configured):
    alone()
    logging.getLogger().setLevel("WARNING")
    logs.info(logging.getLogger("ext_proc.decision"), "decision", FIELDS)
    assert configured.getvalue() == ""


def test_lines_from_info_are_batched_until_flushed(configured):
    alone()
    log = logging.getLogger("ext_proc.decision")
    logs.info(log, "decision", FIELDS)
    logs.info(log, "decision", {**FIELDS, "request_id": "r-2"})
    assert configured.getvalue() == ""
    logs.flush()
    assert [line["request_id"] for line in lines(configured)] == ["r-1", "r-2"]


def test_a_batched_line_carries_the_time_it_was_handed_over_not_the_flushs(configured, monkeypatch):
    alone()
    log = logging.getLogger("ext_proc.decision")
    monkeypatch.setattr(logs.time, "time", lambda: 1_700_000_000.25)
    logs.info(log, "decision", FIELDS)
    monkeypatch.setattr(logs.time, "time", lambda: 1_700_000_000.75)
    logs.info(log, "decision", {**FIELDS, "request_id": "r-2"})
    logs.flush()
    assert [line["time"][-5:] for line in lines(configured)] == [".250Z", ".750Z"]
    assert [line["request_id"] for line in lines(configured)] == ["r-1", "r-2"]


def test_a_line_that_cannot_be_written_is_reported_and_the_others_written(configured, monkeypatch):
    alone()
    monkeypatch.setattr(logging, "raiseExceptions", False)
    log = logging.getLogger("ext_proc.decision")
    logs.info(log, "decision", {1: "a key orjson refuses"})
    logs.info(log, "decision", FIELDS)
    logs.flush()
    assert [line["request_id"] for line in lines(configured)] == ["r-1"]


def test_a_batch_is_written_before_any_other_record(configured):
    alone()
    logs.info(logging.getLogger("ext_proc.decision"), "decision", FIELDS)
    logging.getLogger("ext_proc.server").warning("forced stop")
    assert [line["message"] for line in lines(configured)] == ["decision", "forced stop"]


def test_a_batch_is_written_once_full_or_once_its_first_line_waited(configured, monkeypatch):
    alone()
    log = logging.getLogger("ext_proc.decision")
    for _ in range(logs.BATCH_LINES - 1):
        logs.info(log, "decision", FIELDS)
    assert configured.getvalue() == ""
    logs.info(log, "decision", FIELDS)
    assert len(lines(configured)) == logs.BATCH_LINES
    now = time.time()
    monkeypatch.setattr(logs.time, "time", lambda: now)
    logs.info(log, "decision", FIELDS)
    assert len(lines(configured)) == logs.BATCH_LINES
    monkeypatch.setattr(logs.time, "time", lambda: now + logs.FLUSH_SECONDS)
    logs.info(log, "decision", FIELDS)
    assert len(lines(configured)) == logs.BATCH_LINES + 2


def test_a_failing_stream_loses_the_batch_without_raising(configured, monkeypatch):
    alone()
    monkeypatch.setattr(logging, "raiseExceptions", False)
    logs.info(logging.getLogger("ext_proc.decision"), "decision", FIELDS)
    (handler,) = logging.getLogger().handlers
    handler.stream = io.StringIO()
    handler.stream.close()  # writing raises ValueError
    logs.flush()  # reported by logging, not raised
    handler.stream = configured
    logs.flush()
    assert configured.getvalue() == ""


def test_a_batch_is_written_in_whole_lines_of_at_most_a_pipes_atomic_write(configured):
    alone()
    writes = []

    class Recording(io.StringIO):
        def write(self, text):
            writes.append(text)
            return super().write(text)

    (handler,) = logging.getLogger().handlers
    handler.stream = Recording()
    log = logging.getLogger("ext_proc.decision")
    for number in range(100):
        # Two bytes per é: a chunk measured in characters would run over.
        logs.info(log, "decision", {**FIELDS, "request_id": f"r-{number}-" + "é" * 40})
    logs.flush()
    assert len(writes) > 1
    for text in writes:
        assert text.endswith("\n")
        assert len(text.encode()) <= select.PIPE_BUF
    written = [json.loads(line)["request_id"] for line in "".join(writes).splitlines()]
    assert written == [f"r-{number}-" + "é" * 40 for number in range(100)]
