"""Operating the service: metrics, access log, decision logs, audit mode, drain,
workers, and the Unix-socket, TLS and mTLS listeners, each through the real Envoy."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator, Set
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ext_proc.tools.check_envoy import check
from tests.e2e import certs
from tests.e2e.conftest import ENVOY
from tests.e2e.stack import Stack, read_past_head
from tests.e2e.test_gateway import assert_stripped, chat, error_of, only_request

IDS = [101, 202, 303]


def metrics_text(stack: Stack) -> str:
    with urllib.request.urlopen(f"http://{stack.metrics}/metrics", timeout=5) as reply:
        return reply.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample (labels must match exactly), 0 if absent."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if found == labels:
                return float(match.group(2))
    return 0.0


def access_log(stack: Stack, request_id: str) -> dict:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in stack.logs("envoy").splitlines():
            if line.startswith("{") and request_id in line:
                return json.loads(line)
        time.sleep(0.1)
    raise AssertionError(f"no access log line for {request_id}")


def client_ids(stack: Stack) -> dict[str, str]:
    """The request id each request came with (``client_request_id``), by the id the
    gateway gave it (``request_id``), from Envoy's access log."""
    lines = [json.loads(x) for x in stack.logs("envoy").splitlines() if x[:1] == "{"]
    return {
        line["request_id"]: line["client_request_id"]
        for line in lines
        if "client_request_id" in line
    }


def decision_logs(stack: Stack, request_ids: Set[str] = frozenset()) -> list[dict]:
    """The processor's decision lines, once those of ``request_ids`` (the ids the
    requests came with) are among them (they are written in batches, within a second);
    without any, the lines now. Each line's ``client_request_id`` is the id its request
    came with (the processor logs the gateway's: ``request_id``)."""
    deadline = time.monotonic() + 5
    while True:
        clients = client_ids(stack)
        lines = [json.loads(x) for x in stack.logs("processor").splitlines() if x[:1] == "{"]
        decisions = [
            {**line, "client_request_id": clients.get(line.get("request_id"))}
            for line in lines
            if line.get("message") == "decision"
        ]
        if request_ids <= {d["client_request_id"] for d in decisions}:
            return decisions
        if time.monotonic() > deadline:
            raise AssertionError(f"no decision line for {request_ids}")
        time.sleep(0.1)


# One request per outcome: (path, kv_transfer_params, status, route, action, reason, ids).
DECISIONS = {
    "strip": ("/v1/", {"prompt_token_ids": IDS, "k": 1}, 200,
              "aggregated", "strip", "stripped_by_policy", 3),
    "unproven": ("/pd/v1/", {"prompt_token_ids": IDS, "k": 1}, 200,
                 "disaggregated", "strip", "proof_missing", 3),
    "trusted": ("/trusted/v1/", {"prompt_token_ids": IDS}, 200,
                "trusted", "allow", "trusted_any_caller", 3),
    "deny": ("/trusted/v1/", {"prompt_token_ids": [1, True]}, 400,
             "trusted", "deny", "ids_malformed", 2),
    "none": ("/v1/", None, 200, "aggregated", "allow", "no_transfer_params", 0),
}  # fmt: skip


def test_decisions_are_counted_logged_and_in_the_access_log(gateway):
    before = metrics_text(gateway)
    sent = {}
    with httpx.Client(timeout=20) as client:
        for name, (prefix, params, status, *_) in DECISIONS.items():
            sent[name] = chat(params)
            reply = client.post(
                gateway.url + prefix + "chat/completions",
                json=sent[name],
                headers={"x-request-id": f"decisions-{name}"},
            )
            assert reply.status_code == status, (name, reply.text)
    after = metrics_text(gateway)
    for name, (_, _, status, route, action, reason, count) in DECISIONS.items():
        labels = {"route": route, "action": action, "reason": reason, "mode": "enforce"}
        assert metric(after, "ext_proc_decisions_total", **labels) == (
            metric(before, "ext_proc_decisions_total", **labels) + 1
        ), name
        line = access_log(gateway, f"decisions-{name}")
        assert (line["policy_action"], line["policy_reason"]) == (action, reason), line
        assert (line["policy_id_count"], line["policy_mode"]) == (count, "enforce"), line
        assert line["status"] == status
    assert metric(after, "ext_proc_request_body_bytes_count", route="aggregated") >= 1
    assert metric(after, "ext_proc_processing_seconds_count", route="aggregated") >= 1
    assert "ext_proc_inflight_streams " in after
    assert "ext_proc_inflight_body_bytes " in after
    # Every message Envoy sent on these routes was read by the compiled wire reader:
    # none was left to upb (a second parse per message).
    assert "\next_proc_messages_parsed_by_upb_total 0.0\n" in after

    # What reached the upstream: the untrusted parameters removed whole, the trusted
    # ones as sent; the denied request not at all.
    received = {r.header("x-client-request-id")[0]: json.loads(r.body) for r in gateway.received()}
    assert sorted(received) == sorted(f"decisions-{n}" for n in DECISIONS if n != "deny")
    assert_stripped(received["decisions-strip"], sent["strip"])
    assert_stripped(received["decisions-unproven"], sent["unproven"])
    assert received["decisions-trusted"] == sent["trusted"]
    assert received["decisions-none"] == sent["none"]

    # A decision log line for every outcome but an allow without ids.
    decisions = decision_logs(
        gateway, {f"decisions-{name}" for name in DECISIONS} - {"decisions-none"}
    )
    for name, (_, _, _, route, action, reason, count) in DECISIONS.items():
        logged = [d for d in decisions if d["client_request_id"] == f"decisions-{name}"]
        if name == "none":
            assert logged == []
            continue
        (decision,) = logged
        assert (decision["route"], decision["action"]) == (route, action), decision
        assert (decision["reason"], decision["id_count"]) == (reason, count), decision
    # Never the ids or any prompt text.
    log_text = gateway.logs("processor")
    assert "101, 202" not in log_text
    # (the time of a line may hold "101": its milliseconds; so may Envoy's random
    # x-request-id, a UUID)
    random = ("time", "request_id")
    assert "101" not in json.dumps(
        [{k: v for k, v in d.items() if k not in random} for d in decisions]
    )
    assert "Be careful" not in log_text
    assert "hello" not in log_text


def test_processor_serves_on_uvloop_by_default(gateway):
    lines = [json.loads(x) for x in gateway.logs("processor").splitlines() if x.startswith("{")]
    serving = [line for line in lines if line["message"] == "serving"]
    assert [line["event_loop"] for line in serving] == ["uvloop"]


def test_denial_details_and_decision_in_the_access_log(gateway):
    with httpx.Client(timeout=20) as client:
        reply = client.post(
            gateway.url + "/deny/v1/chat/completions",
            json=chat({"prompt_token_ids": IDS}),
            headers={"x-request-id": "deny-check-1"},
        )
    assert reply.status_code == 400
    line = access_log(gateway, "deny-check-1")
    assert line["details"] == "token_policy_denied_by_policy"
    assert line["policy_action"] == "deny"
    assert line["status"] == 400


def test_audit_route_passes_requests_and_reports_what_it_would_do(gateway):
    sent = chat({"prompt_token_ids": [1, True], "k": 1})
    with httpx.Client(timeout=20) as client:
        reply = client.post(
            gateway.url + "/audit/v1/chat/completions",
            json=sent,
            headers={"x-request-id": "audit-check-1"},
        )
    assert reply.status_code == 200
    assert json.loads(only_request(gateway).body) == json.loads(json.dumps(sent))
    line = access_log(gateway, "audit-check-1")
    assert (line["policy_action"], line["policy_mode"]) == ("deny", "audit")
    assert line["policy_reason"] == "ids_malformed"
    labels = {"route": "audit", "action": "deny", "reason": "ids_malformed", "mode": "audit"}
    assert metric(metrics_text(gateway), "ext_proc_decisions_total", **labels) >= 1


def test_global_audit_mode(tmp_path):
    stack = Stack(tmp_path, processor_config={"audit": True}).start()
    try:
        sent = chat({"prompt_token_ids": IDS})
        with httpx.Client(timeout=20) as client:
            reply = client.post(
                stack.url + "/deny/v1/chat/completions",
                content=json.dumps(sent).encode(),
                headers={"content-type": "application/json"},
            )
            garbage = client.post(
                stack.url + "/v1/chat/completions",
                content=b"not json",
                headers={"content-type": "application/json"},
            )
        assert (reply.status_code, garbage.status_code) == (200, 200)
        bodies = [r.body for r in stack.received()]
        assert bodies == [json.dumps(sent).encode(), b"not json"]
        text = metrics_text(stack)
        labels = {"route": "deny", "action": "deny", "reason": "denied_by_policy", "mode": "audit"}
        assert metric(text, "ext_proc_decisions_total", **labels) == 1
    finally:
        stack.stop()


# --- drain and shutdown -----------------------------------------------------------------


def health_status(stack: Stack) -> int:
    with grpc.insecure_channel(str(stack.processor)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status


def status_of(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.fixture
def draining(tmp_path: Path) -> Iterator[Stack]:
    """Two messages per request: a stream opens with the headers, so an upload still
    under way is a stream the draining processor holds (with one message it has none
    until the body is whole)."""
    config = {"drain_seconds": 1.5, "shutdown_grace_seconds": 10}
    source = ENVOY / "envoy-two-message.yaml"
    stack = Stack(tmp_path, source=source, processor_config=config).start()
    try:
        yield stack
    finally:
        stack.stop()


def test_sigterm_drains_and_in_flight_requests_finish(draining):
    # Told apart from the request sent while draining by its `user`.
    sent = chat({"prompt_token_ids": IDS, "k": 1}, user="in-flight")
    data = json.dumps(sent).encode()
    in_flight = draining.open_upload(len(data), data[:20])
    time.sleep(0.3)
    processor = draining.children["processor"]
    assert health_status(draining) == health_pb2.HealthCheckResponse.SERVING
    started = time.monotonic()
    os.kill(processor.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert health_status(draining) == health_pb2.HealthCheckResponse.NOT_SERVING
    with httpx.Client(timeout=20) as client:  # new requests are still served while draining
        assert client.post(draining.url + "/v1/chat/completions", json=chat()).status_code == 200
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))  # past the drain window
    assert processor.poll() is None  # waiting for the in-flight stream
    in_flight.sendall(data[20:])
    assert status_of(in_flight) == 200
    in_flight.close()
    assert processor.wait(timeout=15) == 0
    bodies = {json.loads(r.body).get("user"): json.loads(r.body) for r in draining.received()}
    assert sorted(bodies, key=str) == [None, "in-flight"]
    assert_stripped(bodies["in-flight"], sent)  # policed by the draining processor


def test_second_signal_forces_exit_and_nothing_half_forwarded(draining):
    data = json.dumps(chat({"prompt_token_ids": IDS})).encode()
    in_flight = draining.open_upload(len(data), data[:20])
    time.sleep(0.3)
    processor = draining.children["processor"]
    os.kill(processor.pid, signal.SIGTERM)
    time.sleep(0.2)
    os.kill(processor.pid, signal.SIGTERM)
    assert processor.wait(timeout=5) == 1
    in_flight.sendall(data[20:])
    status = status_of(in_flight)
    in_flight.close()
    assert status >= 500 or status == 0
    assert draining.received() == []


def head_of(sock: socket.socket) -> bytes:
    """The response's status line and headers (empty if the connection closed first)."""
    return read_past_head(sock).split(b"\r\n\r\n", 1)[0]


def test_a_stream_still_open_when_the_grace_is_over_is_a_503_to_retry(tmp_path):
    """The upload never finishes: its stream outlives the grace and the stop ends it.
    Envoy answers 503 with retry-after (a processor that failed), nothing was forwarded,
    and the processor logs it as one line, not as an error with a traceback."""
    config = {"drain_seconds": 0, "shutdown_grace_seconds": 1}
    source = ENVOY / "envoy-two-message.yaml"
    with Stack(tmp_path, source=source, processor_config=config) as stack:
        data = json.dumps(chat({"prompt_token_ids": IDS})).encode()
        in_flight = stack.open_upload(len(data), data[:20])
        time.sleep(0.3)
        processor = stack.children["processor"]
        os.kill(processor.pid, signal.SIGTERM)
        assert processor.wait(timeout=15) == 0
        head = head_of(in_flight).decode().lower().split("\r\n")
        in_flight.close()
        assert head[0].split(" ", 2)[1] == "503", head
        assert "retry-after: 1" in head
        assert stack.received() == []
        lines = [json.loads(line) for line in stack.logs("processor").splitlines()]
    messages = [line["message"] for line in lines if line.get("level") != "debug"]
    assert messages.count("stream ended at shutdown") == 1, messages
    assert "internal error" not in messages
    assert "protocol error" not in messages
    assert "Traceback" not in stack.logs("processor")


def stream_errors(stack: Stack) -> dict[str, float]:
    text = metrics_text(stack)
    kinds = ("protocol_violation", "internal", "cancelled", "shutdown")
    return {kind: metric(text, "ext_proc_stream_errors_total", kind=kind) for kind in kinds}


def open_streams(stack: Stack) -> float:
    (line,) = (
        x for x in metrics_text(stack).splitlines() if x.startswith("ext_proc_inflight_streams ")
    )
    return float(line.split()[1])


@pytest.mark.parametrize("source", ["envoy-two-message.yaml", "envoy-streamed.yaml"])
def test_a_client_gone_mid_upload_is_one_cancelled_stream_not_two_errors(tmp_path, source):
    """The client closes its connection while its body is sent: Envoy cancels the
    processor's stream mid-body. Nothing is forwarded, and the processor counts one
    cancelled stream, without a protocol error, an internal error or a traceback."""
    with Stack(tmp_path, source=ENVOY / source) as stack:
        data = json.dumps(chat({"prompt_token_ids": IDS})).encode()
        upload = stack.open_upload(len(data), data[:20])
        # The headers reached the processor (streamed: and the first bytes, held).
        wait_for(lambda: open_streams(stack) == 1)
        wait_for(lambda: source == "envoy-two-message.yaml" or stack.inflight() > 0)
        upload.close()
        wait_for(lambda: sum(stream_errors(stack).values()) >= 1)
        ended = ("stream cancelled", "internal error")
        wait_for(lambda: any(message in stack.logs("processor") for message in ended))
        counted = stream_errors(stack)
        assert stack.received() == []
        assert stack.incomplete_count() == 0
        lines = [json.loads(line) for line in stack.logs("processor").splitlines()]
        traceback = "Traceback" in stack.logs("processor")
    assert counted == {"protocol_violation": 0, "internal": 0, "cancelled": 1, "shutdown": 0}
    messages = [line["message"] for line in lines if line.get("level") != "debug"]
    assert messages.count("stream cancelled") == 1, messages
    assert "internal error" not in messages
    assert "protocol error" not in messages
    assert not traceback


# --- workers ----------------------------------------------------------------------------


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def test_workers_serve_their_ports_restart_and_stop_together(tmp_path):
    stack = Stack(tmp_path, workers=2).start()
    supervisor = stack.children["processor"]
    try:
        workers = set()
        wait_for(lambda: len(children_of(supervisor.pid) - {0}) >= 2)
        workers = {p for p in children_of(supervisor.pid) if _is_worker(p)}
        assert len(workers) == 2
        with httpx.Client(timeout=20) as client:
            for _ in range(20):
                reply = client.post(
                    stack.url + "/v1/chat/completions", json=chat({"prompt_token_ids": [1]})
                )
                assert reply.status_code == 200
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: len({p for p in children_of(supervisor.pid) if _is_worker(p)} - workers) == 1
        )
        survivors = {p for p in children_of(supervisor.pid) if _is_worker(p)}
        assert victim not in survivors
        assert len(survivors) == 2
        with httpx.Client(timeout=20) as client:
            statuses = [
                client.post(stack.url + "/v1/chat/completions", json=chat()).status_code
                for _ in range(20)
            ]
        assert statuses.count(200) >= 19  # at most the request on the killed connection
        text = metrics_text(stack)
        labels = {"route": "aggregated", "action": "strip", "reason": "stripped_by_policy",
                  "mode": "enforce"}  # fmt: skip
        assert metric(text, "ext_proc_decisions_total", **labels) >= 20
        os.kill(supervisor.pid, signal.SIGTERM)
        assert supervisor.wait(timeout=20) == 0
        wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in survivors))
    finally:
        stack.stop()


def _is_worker(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# --- listeners --------------------------------------------------------------------------


def strips(stack: Stack) -> None:
    sent = chat({"prompt_token_ids": IDS, "k": 2})
    with httpx.Client(timeout=20) as client:
        reply = client.post(stack.url + "/v1/chat/completions", json=sent)
    assert reply.status_code == 200, reply.text
    assert_stripped(json.loads(only_request(stack).body), sent)


def fails_closed(stack: Stack) -> None:
    """Envoy cannot reach the processor it trusts: an error answer, nothing upstream."""
    with httpx.Client(timeout=20) as client:
        reply = client.post(
            stack.url + "/v1/chat/completions", json=chat({"prompt_token_ids": IDS})
        )
    assert reply.status_code >= 500
    error_of(reply)
    assert stack.received() == []


def test_unix_socket_listener(tmp_path):
    socket_path = tmp_path / "ext_proc.sock"
    stack = Stack(tmp_path, source=ENVOY / "envoy-uds.yaml", processor_socket=socket_path)
    stack.start()
    try:
        assert socket_path.is_socket()
        strips(stack)
    finally:
        stack.stop()


def tls_config(directory: Path, *, mutual: bool) -> dict:
    tls = {
        "cert_file": str(directory / "processor.crt"),
        "key_file": str(directory / "processor.key"),
    }
    if mutual:
        tls["client_ca_file"] = str(directory / "ca.crt")
    return {"tls": tls}


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_listeners(tmp_path, mutual):
    directory = certs.make(tmp_path / "certs")
    source = ENVOY / ("envoy-mtls.yaml" if mutual else "envoy-tls.yaml")
    stack = Stack(
        tmp_path,
        source=source,
        cert_dir=directory,
        processor_config=tls_config(directory, mutual=mutual),
    ).start()
    try:
        strips(stack)
    finally:
        stack.stop()


def name_unpinned(config: dict) -> None:
    """The processor cluster's validation with its CA and no name of the processor."""
    (cluster,) = [c for c in config["static_resources"]["clusters"] if "transport_socket" in c]
    context = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    context["validation_context"].pop("match_typed_subject_alt_names")


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_tls_processor_of_another_name_is_refused_where_the_name_is_pinned(tmp_path, pinned):
    """A server holding a certificate of the processor's CA for another name: the shipped
    wiring (its SAN matcher) refuses it; without the matcher Envoy takes it for the
    processor, and check-envoy refuses that configuration."""
    directory = certs.impostor(certs.make(tmp_path / "certs"))
    served = {
        "cert_file": str(directory / "impostor.crt"),
        "key_file": str(directory / "impostor.key"),
    }
    stack = Stack(
        tmp_path,
        source=ENVOY / "envoy-tls.yaml",
        cert_dir=directory,
        processor_config={"tls": served},
        edit=None if pinned else name_unpinned,
    ).start()
    try:
        rendered = yaml.safe_load((tmp_path / "envoy.yaml").read_text())
        codes = check(rendered, processor="tls").codes("error")
        if pinned:
            fails_closed(stack)
            assert "processor-name-unpinned" not in codes
        else:
            strips(stack)
            assert "processor-name-unpinned" in codes
    finally:
        stack.stop()


def test_mtls_refuses_an_envoy_without_client_certificate(tmp_path):
    directory = certs.make(tmp_path / "certs")
    stack = Stack(
        tmp_path,
        source=ENVOY / "envoy-tls.yaml",  # presents no client certificate
        cert_dir=directory,
        processor_config=tls_config(directory, mutual=True),
    ).start()
    try:
        fails_closed(stack)
    finally:
        stack.stop()
