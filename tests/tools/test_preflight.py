"""What serve proves before it opens its port (ext_proc/tools/preflight.py): the key
files read by serving's own loader, every route's metadata of the Envoy configuration
it serves, and a Redis record it can use; each failure one line naming the file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.core.config import Config, ConfigError
from ext_proc.edge.keys import KeyFileError
from ext_proc.edge.redis_record import RecordUnreachable
from ext_proc.tools import preflight
from tests.tools.check_envoy.shipped import SHIPPED, policy

REPO = Path(__file__).resolve().parents[2]


def config_with_key(path: Path) -> Config:
    return Config.model_validate({"proof": {"keys": [{"id": "k1", "file": str(path)}]}})


def test_key_files_serving_can_read_pass(tmp_path):
    key = tmp_path / "k1"
    key.write_text("a" * 64)
    preflight.keys(config_with_key(key))


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "cannot read proof key file"), ("short", "holds fewer than 32 bytes")],
    ids=["missing", "short"],
)
def test_a_key_file_serving_cannot_read_is_named(tmp_path, content, said):
    key = tmp_path / "k1"
    if content is not None:
        key.write_text(content)
    with pytest.raises(KeyFileError, match=said) as caught:
        preflight.keys(config_with_key(key))
    assert str(key) in str(caught.value)


def written(tmp_path: Path, document: Any) -> Path:
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_shipped_envoy_configs_routes_pass():
    for name in ("envoy.yaml", "envoy-two-message.yaml", "envoy-streamed.yaml"):
        preflight.routes(REPO / "envoy" / name, "ext_proc.token_policy")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"action": "honr"},
            "route vllm/disaggregated: invalid route policy metadata: field "
            "'ext_proc.token_policy.action' is 'honr'; allowed values: 'strip', 'deny', ",
        ),
        (
            {"colour": "blue"},
            "route vllm/disaggregated: invalid route policy metadata: unknown field "
            "'ext_proc.token_policy.colour'; allowed fields: ",
        ),
    ],
    ids=["value", "unknown-field"],
)
def test_a_routes_invalid_metadata_is_one_line_naming_file_route_and_field(tmp_path, change, said):
    document = copy.deepcopy(SHIPPED)
    policy(document, "disaggregated").update(change)
    path = written(tmp_path, document)
    with pytest.raises(ConfigError) as caught:
        preflight.routes(path, "ext_proc.token_policy")
    message = str(caught.value)
    assert message.startswith(f"{path}: http_connection_manager[0] ")
    assert said in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "cannot read: No such file or directory"),
        ("{{{: [\n", "not YAML: expected the node content, but found ':' (line 1, column 4)"),
        ("just text\n", "no HTTP connection manager found"),
    ],
    ids=["missing", "not-yaml", "no-bootstrap"],
)
def test_an_unreadable_envoy_config_is_one_line(tmp_path, text, said):
    path = tmp_path / "envoy.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        preflight.routes(path, "ext_proc.token_policy")
    assert str(caught.value) == f"{path}: {said}"


def test_a_record_the_processor_keeps_itself_needs_no_check():
    preflight.record(Config())  # no Redis: nothing to reach


UNREACHABLE = Config.model_validate(
    {"proof": {"record": "redis://127.0.0.1:1/0", "record_timeout_seconds": 0.1}}
)


def test_every_check_runs_in_order(tmp_path):
    document = copy.deepcopy(SHIPPED)
    policy(document, "disaggregated").update(action="honr")
    bad_routes = written(tmp_path, document)
    # No key files: the Envoy configuration is next, then the record (unreachable).
    with pytest.raises(ConfigError, match="invalid route policy metadata"):
        preflight.check_all(UNREACHABLE, bad_routes)
    preflight.check_all(Config(), REPO / "envoy" / "envoy.yaml")


def test_a_redis_that_does_not_answer_is_logged_and_serving_goes_on(caplog):
    """An outage of the record is no configuration error: serve starts (and honors no
    proof until it answers); asked to reach it (check-config --connect), it is one."""
    preflight.check_all(UNREACHABLE, REPO / "envoy" / "envoy.yaml")
    (logged,) = [r for r in caplog.records if r.name == "ext_proc.record"]
    assert logged.levelname == "WARNING"
    assert logged.getMessage().startswith("proof record: serving without it; ")
    assert getattr(logged, "state", None) == "unreachable"
    with pytest.raises(RecordUnreachable, match=r"^proof.record: the Redis cannot be consulted \("):
        preflight.record(UNREACHABLE, reach=True)
