"""The fail-closed settings every shipped or generated ext_proc filter must carry."""

from __future__ import annotations

from typing import Any

from ext_proc.edge.attributes import READ_HEADERS, attribute_keys
from ext_proc.tools.check_envoy import EXT_PROC


def assert_fails_closed(
    config: dict[str, Any], *, body_mode: str = "BUFFERED", one_message: bool = True
) -> None:
    """``config`` is the ext_proc filter's ``typed_config``; ``one_message``: the headers
    are skipped and requested as attributes instead (the shipped default)."""
    assert config["@type"] == EXT_PROC
    assert config["failure_mode_allow"] is False
    assert "allow_content_length_header" not in config
    assert "observability_mode" not in config
    assert config["message_timeout"] == "5s"
    assert config["processing_mode"]["request_body_mode"] == body_mode
    assert config["processing_mode"]["request_header_mode"] == ("SKIP" if one_message else "SEND")
    headers = list(READ_HEADERS.values()) if one_message else []
    assert config["request_attributes"] == [*attribute_keys().all(), *headers]
