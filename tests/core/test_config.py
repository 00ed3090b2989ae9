import re
import subprocess
import sys

import pytest
from redis.connection import parse_url

from ext_proc.__main__ import main
from ext_proc.core import replay
from ext_proc.core.config import Config, ConfigError


def test_defaults():
    config = Config.load(environ={})
    assert config.listen == "127.0.0.1:9000"
    assert config.max_body_bytes == 16 * 1024 * 1024
    assert config.grpc_message_limit > config.max_body_bytes


def test_tracing_is_off_by_default_and_set_from_the_file_or_environment(tmp_path):
    assert Config.load(environ={}).tracing.enabled is False
    path = tmp_path / "c.yaml"
    path.write_text("tracing: {enabled: true, endpoint: 'otel:4317', sample_ratio: 0.25}\n")
    tracing = Config.load(path, environ={}).tracing
    assert (tracing.enabled, tracing.endpoint, tracing.sample_ratio) == (True, "otel:4317", 0.25)
    assert tracing.service_name == "ext-proc-token-policy"
    environ = {"EXT_PROC_TRACING": "{enabled: true, sample_ratio: 0}"}
    assert Config.load(environ=environ).tracing.sample_ratio == 0


def test_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("listen: 0.0.0.0:1\nlog_level: debug\nmax_body_bytes: 1000\n")
    config = Config.load(path, listen="127.0.0.1:2", log_level=None)
    assert (config.listen, config.log_level, config.max_body_bytes) == (
        "127.0.0.1:2",
        "debug",
        1000,
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("log_level: loud\n", "log_level"),
        ("max_body_bytes: 0\n", "max_body_bytes"),
        ("max_body_bytes: '10'\n", "max_body_bytes"),
        ("lisen: x\n", "lisen"),
        ("event_loop: trio\n", "event_loop"),
        ("tracing: {sample_ratio: 1.5}\n", "tracing.sample_ratio"),
        ("tracing: {endpoint: collector}\n", "tracing.endpoint"),
        ("tracing: {service_name: ''}\n", "tracing.service_name"),
        ("tracing: {enabled: true, exporter: zipkin}\n", "tracing.exporter"),
    ],
)
def test_invalid_values_name_the_field(tmp_path, text, field):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field):
        Config.load(path)


def test_non_mapping_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        Config.load(path)


def test_config_is_frozen():
    with pytest.raises(ValueError, match="frozen"):
        Config.load().listen = "x"  # type: ignore[misc]


def test_environment_overrides_file_and_flags_override_environment(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workers: 1\naudit: false\n")
    environ = {"EXT_PROC_WORKERS": "3", "EXT_PROC_AUDIT": "true", "EXT_PROC_CACHE": "/x"}
    config = Config.load(path, environ=environ)
    assert (config.workers, config.audit) == (3, True)
    assert Config.load(path, environ=environ, workers=2).workers == 2


def test_environment_values_are_validated():
    with pytest.raises(ConfigError, match="workers"):
        Config.load(environ={"EXT_PROC_WORKERS": "many"})


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ({"workers": 2, "listen": "unix:/tmp/x.sock"}, "TCP listen address"),
        ({"max_body_bytes": 100, "inflight_budget_bytes": 10}, "inflight_budget_bytes"),
        ({"metrics_listen": "9464"}, "metrics_listen"),
        ({"tls": {"cert_file": "a"}}, "tls.key_file"),
        ({"tls": {"cert_file": "a", "key_file": "b", "ca": "c"}}, "tls.ca"),
        ({"log_level": "loud"}, "'debug', 'info', 'warning' or 'error'"),
    ],
)
def test_inconsistent_settings_are_named(data, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        Config.load(environ={}, **data)


def test_check_config_command(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("workers: 2\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: 0\n")
    assert main(["check-config", str(good)]) == 0
    assert main(["check-config", str(bad)]) == 1


def test_loading_the_configuration_imports_no_parser():
    # The memory model's limits live with the model: the config needs no body parser.
    probe = (
        "import sys, ext_proc.core.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('numpy', 'orjson', 'stringzilla', 'grpc') "
        "or m in ('ext_proc.core.reading', 'ext_proc.core.spelling', 'ext_proc.core.writing', "
        "'ext_proc.core.ids')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_proof_lifetime_beyond_the_connectors_lease_fails_to_load():
    with pytest.raises(ConfigError, match="kv_lease_seconds"):
        Config.load(environ={}, proof={"ttl_seconds": 60})
    with pytest.raises(ConfigError, match="kv_lease_seconds"):
        Config.load(environ={}, proof={"ttl_seconds": 21})  # 21 + 2 x 5 > 30
    stated = Config.load(environ={}, proof={"ttl_seconds": 60, "kv_lease_seconds": 70})
    assert stated.proof.ttl_seconds == 60
    default = Config.load(environ={}).proof
    assert default.ttl_seconds + 2 * default.clock_skew_seconds <= default.kv_lease_seconds == 30


def test_a_turn_proof_lifetime_beyond_the_decode_blocks_ttl_fails_to_load():
    with pytest.raises(ConfigError, match="decode_blocks_ttl_seconds"):
        Config.load(environ={}, proof={"turn_ttl_seconds": 471})  # 471 + 2 x 5 > 480
    stated = Config.load(
        environ={}, proof={"turn_ttl_seconds": 900, "decode_blocks_ttl_seconds": 910}
    )
    assert stated.proof.turn_ttl_seconds == 900
    default = Config.load(environ={}).proof
    assert default.turn_ttl_seconds + 2 * default.clock_skew_seconds <= 480
    assert default.decode_blocks_ttl_seconds == 480


ZERO = [
    "redis://127.0.0.1:6379",
    "redis://127.0.0.1:6379/",
    "redis://127.0.0.1:6379/0",
    "redis://user:pass@ext-proc-redis:6379/0",
    "rediss://ext-proc-redis:6380/0?ssl_cert_reqs=required",
    "unix:///run/redis.sock",
    "unix:///run/redis/0",
]
ANOTHER = [
    "redis://127.0.0.1:6379/1",
    "redis://127.0.0.1:6379/%31",
    "redis://127.0.0.1:6379/0?db=1",
    "redis://127.0.0.1:6379?db=0",
    "rediss://ext-proc-redis:6380/15",
    "redis://127.0.0.1:6379/x",
    "unix:///run/redis.sock?db=2",
]


@pytest.mark.parametrize("url", ANOTHER)
def test_a_record_in_another_database_than_0_is_refused(url):
    """Processors on two databases of one Redis would keep two records: every record
    is database 0, so all that share a Redis share it."""
    with pytest.raises(ConfigError, match="database 0"):
        Config.load(environ={}, proof={"record": url})


@pytest.mark.parametrize("url", ZERO)
def test_an_accepted_record_url_is_database_0_as_redis_py_reads_it(url):
    assert Config.load(environ={}, proof={"record": url}).proof.record == url
    assert parse_url(url).get("db", 0) == 0


def test_the_record_is_a_redis_url_or_the_local_table_charged_to_the_budget():
    with pytest.raises(ConfigError, match=r"proof\.record"):
        Config.load(environ={}, proof={"record": "http://redis:6379"})
    shared = Config.load(environ={}, proof={"record": "redis://127.0.0.1:6379/0"})
    assert shared.record_bytes == 0
    local = Config.load(environ={})
    assert local.record_bytes == replay.table_bytes(local.proof.record_slots)
    with pytest.raises(ConfigError, match="record of spent proofs"):
        Config.load(environ={}, max_body_bytes=16, inflight_budget_bytes=4096)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://", "a redis:// URL names a host"),
        ("rediss://:6380/0", "a rediss:// URL names a host"),
        ("redis://ext-proc-redis:0/0", "the port must be a number from 1 to 65535"),
        ("redis://ext-proc-redis:65536/0", "the port must be a number from 1 to 65535"),
        ("redis://ext-proc-redis:637x/0", "the port must be a number from 1 to 65535"),
        ("unix://", "a unix:// URL names the socket's path"),
        ("redis:/ext-proc-redis:6379/0", "a redis://, rediss:// or unix:// URL"),
        ("Redis://ext-proc-redis:6379/0", "a redis://, rediss:// or unix:// URL"),
    ],
)
def test_a_record_url_that_names_no_redis_is_refused(url, said):
    """What a URL lacks to name a Redis is a configuration error (serve does not start,
    check-config fails); whether the Redis answers is not."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        Config.load(environ={}, proof={"record": url})


def test_the_redis_password_comes_from_a_file_named_beside_the_record():
    """The configuration file is often a ConfigMap: the password is a file (a mounted
    Secret), the URL names at most the user."""
    proof = Config.load(
        environ={},
        proof={"record": "redis://ext-proc@redis:6379/0", "record_password_file": "/s/pw"},
    ).proof
    assert proof.record_password_file == "/s/pw"
    assert Config.load(environ={}).proof.record_password_file is None


@pytest.mark.parametrize(
    ("proof", "words"),
    [
        ({"record": "redis://u:pass@redis:6379/0", "record_password_file": "/s/pw"}, "once"),
        ({"record": "redis://:pass@redis:6379/0", "record_password_file": "/s/pw"}, "once"),
        ({"record_password_file": "/s/pw"}, "needs a Redis"),
        ({"record": "redis://redis:6379/0", "record_password_file": ""}, "at least 1 character"),
    ],
)
def test_a_password_given_twice_or_without_a_redis_is_refused(proof, words):
    with pytest.raises(ConfigError, match=words):
        Config.load(environ={}, proof=proof)
