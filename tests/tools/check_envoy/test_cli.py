"""``python -m ext_proc check-envoy``: one line per finding with its severity and code,
then the verdict, which says whether ``envoy --mode validate`` ran; exit 1 on an error,
and when Envoy's validation could not run and was not skipped."""

import copy
import sys

import yaml

from ext_proc.__main__ import main as cli
from ext_proc.tools.check_envoy import main
from tests.tools.check_envoy.shipped import SHIPPED, SHIPPED_DIR, per_route, policy, route
from tests.tools.check_envoy.test_check import with_admin_listener

SKIPPED = "; envoy --mode validate skipped (--no-envoy-validate)"


def write(tmp_path, config):
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_error_is_a_line_with_its_code_and_exit_1(tmp_path, capsys):
    config = copy.deepcopy(SHIPPED)
    route(config, "aggregated").update(typed_per_filter_config=per_route(disabled=True))
    path = write(tmp_path, config)
    assert main(path, validate=False) == 1
    error, verdict = capsys.readouterr().out.splitlines()
    assert error.startswith(
        "error[ext-proc-not-running]: http_connection_manager[0] route vllm/aggregated: "
    )
    assert verdict == f"{path}: FAILED (12 routes, 1 errors, 0 warnings{SKIPPED})"


def test_warnings_alone_pass(tmp_path, capsys):
    config = copy.deepcopy(SHIPPED)
    route(config, "disaggregated").pop("metadata")
    path = write(tmp_path, config)
    assert main(path, validate=False) == 0
    warning, verdict = capsys.readouterr().out.splitlines()
    assert warning.startswith("warning[policy-missing]: http_connection_manager[0] route ")
    assert verdict == f"{path}: OK (12 routes, 0 errors, 1 warnings{SKIPPED})"


def test_main_takes_listener_names(tmp_path, capsys):
    config = copy.deepcopy(SHIPPED)
    with_admin_listener(config)
    path = write(tmp_path, config)
    gateway = config["static_resources"]["listeners"][0]["name"]
    assert main(path, validate=False) == 1
    assert main(path, listeners=frozenset({gateway}), validate=False) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == f"{path}: OK (12 routes, 0 errors, 0 warnings{SKIPPED})"
    )


def test_an_unreadable_file_is_one_line_and_exit_1(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [")
    assert main(path) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{path}: not YAML: ")
    assert captured.err.count("\n") == 1
    assert main(tmp_path / "missing.yaml") == 1
    assert (
        capsys.readouterr().err
        == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory\n"
    )


def test_a_declared_filter_is_named_on_the_command_line(tmp_path, capsys):
    config = copy.deepcopy(SHIPPED)
    chain = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["http_filters"]
    # A picker that writes its own header (known not to be one the router retries by).
    picker = {
        "name": "picker",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3."
            "HeaderMutation",
            "mutations": {
                "request_mutations": [
                    {"append": {"header": {"key": "x-gateway-destination-endpoint", "value": "a"}}}
                ]
            },
        },
    }
    chain.insert(len(chain) - 1, picker)
    path = write(tmp_path, config)
    assert cli(["check-envoy", str(path)]) == 1
    assert capsys.readouterr().out.startswith("error[filter-after-decision]: ")
    assert cli(["check-envoy", str(path), "--declared-filter", "picker"]) == 0


def test_the_ok_line_says_envoy_validated_the_file(capsys):
    path = SHIPPED_DIR / "envoy.yaml"
    assert cli(["check-envoy", str(path)]) == 0
    (verdict,) = capsys.readouterr().out.splitlines()
    assert verdict == f"{path}: OK (12 routes, 0 errors, 0 warnings; envoy --mode validate passed)"


def test_without_an_envoy_the_check_fails_unless_told_to_skip_it(tmp_path, monkeypatch, capsys):
    """Run from the wheel or the image, no envoy is beside the interpreter or on PATH: an
    OK would vouch for a file Envoy may reject."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    path = SHIPPED_DIR / "envoy.yaml"
    assert cli(["check-envoy", str(path)]) == 1
    error, verdict = capsys.readouterr().out.splitlines()
    assert error.startswith("error[envoy-validate-not-run]: envoy --mode validate did not run: ")
    assert "--no-envoy-validate" in error
    assert verdict == (
        f"{path}: FAILED (12 routes, 1 errors, 0 warnings; envoy --mode validate did not run)"
    )
    assert cli(["check-envoy", "--no-envoy-validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: OK (12 routes, 0 errors, 0 warnings{SKIPPED})\n"


def test_a_misspelt_namespace_on_a_mint_route_fails_the_check(tmp_path, capsys):
    """Every decode would recompute with clients seeing 200: exit 1, not a warning."""
    config = copy.deepcopy(SHIPPED)
    metadata = route(config, "prefill")["metadata"]["filter_metadata"]
    metadata["ext_proc.token_polcy"] = metadata.pop("ext_proc.token_policy")
    path = write(tmp_path, config)
    assert main(path, validate=False) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [x.partition(":")[0] for x in lines[:-1]] == [
        "warning[policy-missing]",
        "error[policy-namespace-misspelt]",
    ]
    assert lines[-1].startswith(f"{path}: FAILED (12 routes, 1 errors, 1 warnings; ")


def test_a_misspelt_field_in_the_namespace_fails_the_check(tmp_path, capsys):
    config = copy.deepcopy(SHIPPED)
    policy(config, "prefill")["actoin"] = policy(config, "prefill").pop("action")
    path = write(tmp_path, config)
    assert main(path, validate=False) == 1
    error, _ = capsys.readouterr().out.splitlines()
    assert error.startswith("error[policy-invalid]: ")
    assert "unknown field 'ext_proc.token_policy.actoin'" in error
