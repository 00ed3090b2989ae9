import json
import logging
import time

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
