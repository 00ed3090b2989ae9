import io
import json
import logging
import re
import time

import pytest

from ext_proc import logs
from ext_proc.logs import JsonFormatter


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


@pytest.fixture
def configured(monkeypatch):
    """logs.configure() writing to a buffer; the root logger restored afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    logs.configure("info")
    yield buffer
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


FIELDS = {"request_id": "r-1", "route": "aggregated", "action": "strip", "id_count": 3}


def lines(buffer):
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_info_writes_what_the_logging_machinery_writes(configured):
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
    log = logging.getLogger("ext_proc.decision")
    seen = []
    extra = logging.Handler()
    extra.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(extra)
    logs.info(log, "decision", FIELDS)
    assert [r.route for r in seen] == ["aggregated"]
    logging.getLogger().removeHandler(extra)
    log.addFilter(lambda record: False)
    try:
        logs.info(log, "decision", FIELDS)
    finally:
        log.filters.clear()
    assert len(lines(configured)) == 1  # the first line only: the filter dropped the second


def test_info_respects_the_level(configured):
    logging.getLogger().setLevel("WARNING")
    logs.info(logging.getLogger("ext_proc.decision"), "decision", FIELDS)
    assert configured.getvalue() == ""
