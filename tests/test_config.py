import pytest

from ext_proc.config import Config, ConfigError


def test_defaults():
    config = Config.load()
    assert config.listen == "127.0.0.1:9000"
    assert config.max_body_bytes == 16 * 1024 * 1024
    assert config.grpc_message_limit > config.max_body_bytes


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
