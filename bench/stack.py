"""The processes of one benchmark run: nginx upstream, processors and one Envoy each.

Every arrangement gets its own Envoy (``--concurrency 1``, or ``envoy_concurrency``
worker threads) rendered from a shipped
config (``envoy/envoy.yaml``, one gRPC message per request, unless the arrangement
names ``envoy/envoy-two-message.yaml``) with ``envoy_config.render``, all in front of
one nginx:

- ``direct``: the rendered config with the ext_proc filter removed;
- ``naive`` (two messages) and ``naive-1msg`` (one, the floor): the rendered config
  pointing at ``bench.naive``;
- ``service-wN`` (one message) and ``service-wN-2msg`` (two): the rendered config
  pointing at ``python -m ext_proc serve --workers N``, each worker's port an endpoint
  of the processor cluster (``envoygen.processor_workers_fields``), as a gateway in
  front of ``--workers`` is configured: Envoy picks a worker per stream;
- ``service-wN-redis``: as ``service-wN``, its record of spent proofs in a
  ``redis-server`` the stack starts (one per arrangement: a Redis keeps one record);
- ``service-wN-native-PARTS``: as ``service-wN``, with ``EXT_PROC_NATIVE`` set in its
  environment only: the parts named run compiled, the others their pure-Python reference
  (``none``: every part its reference).

Every config also has ``/pd-any/v1/``: the shipped decode route trusting any caller's
ids (``trust_any_caller``), for the unproven honor and deny bodies; the service verifies
the proven bodies of ``/pd/v1/`` with the benchmark's key (bench/proofs.py) and spends
each proof in its record. And ``/strict/v1/``: the shipped aggregated route forwarding
only what vLLM declares (``strict_body``), for the strict bodies.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import bodies, ledger, proofs
from devstack import envoy_config, processes
from ext_proc.core import native
from ext_proc.core.address import HostPort
from ext_proc.edge import redis_record
from ext_proc.edge.supervisor import worker_ports
from ext_proc.tools import carrier_headers, envoygen, refused_paths

REPO = Path(__file__).resolve().parents[1]
LOCAL = "127.0.0.1"
POLICY = "ext_proc.token_policy"
DECODE_ROUTE = "disaggregated"  # the shipped /pd/v1/ route (honor)
AGGREGATED_ROUTE = "aggregated"  # the shipped /v1/ route (allow, strip)
UPSTREAM_REPLY = b'{"id":"bench","object":"chat.completion","choices":[]}'
# How long a service may take to log its serving line once its ports answer.
SERVING_LINE_SECONDS = 15.0
# The shipped default (one gRPC message per request) and the two-message variant.
DEFAULT_CONFIG = "envoy.yaml"
TWO_MESSAGES = "envoy-two-message.yaml"


@dataclass(frozen=True)
class Arrangement:
    kind: str  # direct | naive | service
    workers: int | None = None
    # The shipped Envoy config the arrangement runs behind (envoy/<config>).
    config: str = DEFAULT_CONFIG
    # The service's record of spent proofs: "local" (its own table, the default) or
    # "redis" (proof.record: redis://..., a redis-server of the stack).
    record: str = "local"
    # The cost ledger (bench/ledger.py): a `ledger` processor's rung (ledger.RUNGS), or
    # for `direct` and `naive` the Envoy rung (ENVOY_RUNGS) their config stops at; ""
    # for the kind's own (direct: "log", naive: "attributes").
    rung: str = ""
    # A service's EXT_PROC_NATIVE (ext_proc/core/native.py): which compiled parts run,
    # the others their pure-Python reference; "" leaves it as the harness's environment
    # has it (unset: every part compiled, as shipped).
    native: str = ""

    @property
    def name(self) -> str:
        if self.kind == "ledger":
            return f"ledger-{self.rung}"
        if self.native:
            return f"{self.kind}-w{self.workers or 1}-native-{native_suffix(self.native)}"
        name = self.kind if self.workers is None else f"{self.kind}-w{self.workers}"
        if self.rung:
            return f"{name}-1msg-{self.rung}" if self.kind == "naive" else f"{name}-{self.rung}"
        # `naive` is the two-message naive processor and `naive-1msg` the floor; a
        # service arrangement is named for the default unless it sends two messages.
        if self.kind == "naive" and self.config == DEFAULT_CONFIG:
            name += "-1msg"
        elif self.kind == "service" and self.config == TWO_MESSAGES:
            name += "-2msg"
        if self.kind == "service" and self.record == "redis":
            name += "-redis"
        return name

    @property
    def polices(self) -> bool:
        """Whether it answers as the service does: a rung of the ledger from ``encode``
        on does (the rungs before answer every body with an empty continue)."""
        if self.kind == "ledger":
            return ledger.RUNGS.index(self.rung) >= ledger.RUNGS.index("encode")
        return self.kind == "service"

    @property
    def default(self) -> bool:
        """The arrangement shipped by default: envoy/envoy.yaml (one message per
        request) and one processor."""
        return (
            self.kind == "service"
            and self.workers == 1
            and self.config == DEFAULT_CONFIG
            and self.record == "local"
            and not self.native
        )

    def environment(self) -> dict[str, str] | None:
        """The processor's environment: the harness's, with the arrangement's
        EXT_PROC_NATIVE; None (inherited unchanged) without one."""
        if not self.native:
            return None
        return {**os.environ, native.ENVIRONMENT: self.native}

    def expected_implementations(self) -> dict[str, str] | None:
        """What the service's ``serving`` log line must state for each part where the
        arrangement sets EXT_PROC_NATIVE (None where it does not)."""
        if not self.native:
            return None
        compiled = native.parse(self.native)
        return {part: "compiled" if part in compiled else "python" for part in native.PARTS}


def native_suffix(value: str) -> str:
    """An EXT_PROC_NATIVE value as a name's suffix: ``none``, ``all``, or the parts
    compiled in the value's order without their package (``scan-wire``). Raises
    ValueError where the service would refuse the value (ext_proc/core/native.py)."""
    compiled = native.parse(value)
    if not compiled:
        return "none"
    if value.strip() in ("", "1"):
        return "all"
    return "-".join(name.strip().split(".")[-1].lstrip("_") for name in value.split(","))


def served_implementations(
    log: Path, process: subprocess.Popen[bytes], wait: float = SERVING_LINE_SECONDS
) -> dict[str, str] | None:
    """Each part's implementation as the service's ``serving`` log line states it,
    waiting up to ``wait`` seconds for the line (the service writes its lines in
    batches, at least every second); None without one."""
    deadline = time.monotonic() + wait
    while True:
        for line in log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                fields = json.loads(line)
                if isinstance(fields, dict) and fields.get("message") == "serving":
                    return dict(fields.get("implementation") or {})
        if process.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def nginx_conf(workdir: Path, port: int) -> str:
    """A one-process nginx answering every POST with a small JSON 200.

    The body is read whole before the answer (``mirror_request_body`` reads it before
    the content phase), as vLLM does; a 200 sent after the headers alone would make
    Envoy close the upstream connection on large bodies. The static file refuses POST
    with 405, which ``error_page`` turns into a GET of the same file.
    """
    www = workdir / "www"
    www.mkdir(exist_ok=True)
    (www / "ok.json").write_bytes(UPSTREAM_REPLY)
    temp = workdir / "nginx-temp"
    return f"""
daemon off;
master_process off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 2m;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {{
    listen {LOCAL}:{port} backlog=4096;
    location = /ok.json {{ internal; root {www}; default_type application/json; }}
    location = /_read_body {{ internal; return 204; }}
    location / {{
      mirror /_read_body;
      mirror_request_body on;
      root {www};
      rewrite ^ /ok.json break;
      error_page 405 =200 /ok.json;
    }}
  }}
}}
"""


@dataclass
class Running:
    arrangement: Arrangement
    gateway: HostPort
    admin: HostPort
    processor: subprocess.Popen[bytes] | None = None
    envoy: subprocess.Popen[bytes] | None = None
    # The service's metrics endpoint (None: not a service, or no --metrics-listen).
    metrics: HostPort | None = None

    @property
    def envoy_pid(self) -> int:
        if self.envoy is None:
            raise RuntimeError("envoy not started")
        return self.envoy.pid

    def url(self, path: str) -> str:
        return f"http://{self.gateway}{path}"

    def decisions(self) -> Counter[str] | None:
        """The service's decision counts by reason so far (None: no metrics to read)."""
        if self.metrics is None:
            return None
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        counts: Counter[str] = Counter()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "ext_proc_decisions_total":
                    counts[sample.labels["reason"]] += int(sample.value)
        return counts

    def stats(self) -> dict[str, int]:
        """Envoy's counters about the processor connection and the answers."""
        wanted = (
            "cluster.ext_proc.upstream_cx_total",
            "cluster.ext_proc.upstream_rq_total",
            "cluster.aggregated.upstream_cx_total",
            "cluster.disaggregated.upstream_cx_total",
            "http.gateway.downstream_rq_2xx",
            "http.gateway.downstream_rq_4xx",
            "http.gateway.downstream_rq_5xx",
        )
        url = f"http://{self.admin}/stats?format=json"
        with urllib.request.urlopen(url, timeout=5) as reply:
            stats = json.loads(reply.read())["stats"]
        return {s["name"]: int(s["value"]) for s in stats if s.get("name") in wanted}


@dataclass
class BenchStack:
    workdir: Path
    nginx: str
    arrangements: list[Arrangement]
    # Options of `python -m ext_proc serve` (tools.serve_options): newer ones are used
    # only when the service has them.
    serve_options: frozenset[str]
    # redis-server (tools.ensure_tools), needed when an arrangement's record is Redis.
    redis: str | None = None
    # The size of each service's own table of spent proofs (proofs.processor_config).
    record_slots: int = 65536
    # Each Envoy's worker threads (--concurrency): 1 keeps Envoy on one of the two cores
    # of the reference machine; 2 gives it both, as its default would.
    envoy_concurrency: int = 1
    upstream: HostPort = field(default_factory=lambda: HostPort(LOCAL, processes.free_port()))
    running: dict[str, Running] = field(default_factory=dict)
    # Each service's implementation of each compiled part, as its serving line states.
    implementations: dict[str, dict[str, str]] = field(default_factory=dict)
    nginx_process: subprocess.Popen[bytes] | None = None
    # Each Redis arrangement's redis-server, by the arrangement's name.
    redis_addresses: dict[str, HostPort] = field(default_factory=dict)
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> BenchStack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        conf = self.workdir / "nginx.conf"
        conf.write_text(nginx_conf(self.workdir, self.upstream.port))
        (self.workdir / "nginx-temp").mkdir(exist_ok=True)
        args = [self.nginx, "-p", str(self.workdir), "-c", str(conf)]
        args += ["-e", str(self.workdir / "nginx-error.log")]
        self.nginx_process = nginx = processes.start(args, self.workdir / "nginx.log", cwd=REPO)
        self._children.append(nginx)
        processes.wait_for_port(self.upstream.port, nginx)
        for arrangement in self.arrangements:
            if arrangement.record == "redis":
                self._start_redis(arrangement)
        for arrangement in self.arrangements:
            self.running[arrangement.name] = self._start_arrangement(arrangement)
        # A processor's own table, made before it serves, honors only proofs minted after
        # it began, a skew rounded up included (ext_proc/edge/record.py): the pools are
        # minted after that.
        fresh = math.ceil(time.time()) + proofs.SKEW + 1
        time.sleep(max(0.0, fresh - time.time()))
        for arrangement in self.arrangements:
            if arrangement.kind == "service":
                self._check_implementations(arrangement)

    def _check_implementations(self, arrangement: Arrangement) -> None:
        """Read which implementation the service runs for each part; an arrangement
        that sets EXT_PROC_NATIVE must run what it asks (a part not built would run its
        reference and the rung would measure something else than it says)."""
        name = arrangement.name
        processor = self.running[name].processor
        if processor is None:
            raise RuntimeError(f"{name}: processor not started")
        log = self.workdir / f"{name}-processor.log"
        expected = arrangement.expected_implementations()
        # Every service started before the wait for fresh proofs: its line is written.
        wait = 0.0 if expected is None else SERVING_LINE_SECONDS
        served = served_implementations(log, processor, wait)
        if served is not None:
            self.implementations[name] = served
        if expected is not None and served != expected:
            raise RuntimeError(f"{name}: the service runs {served}, not {expected} as asked")

    def _start_redis(self, arrangement: Arrangement) -> None:
        """A redis-server on loopback for ``arrangement``'s record, nothing persisted,
        nothing evicted."""
        if self.redis is None:
            raise ValueError("an arrangement keeps its spent proofs in Redis: give redis-server")
        address = self.redis_addresses[arrangement.name] = HostPort(LOCAL, processes.free_port())
        args = [self.redis, "--bind", LOCAL, "--port", str(address.port)]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        args += ["--maxmemory-policy", "noeviction", "--protected-mode", "yes"]
        log = self.workdir / f"{arrangement.name}-redis.log"
        server = processes.start(args, log, cwd=REPO)
        self._children.append(server)
        processes.wait_for_port(address.port, server)
        # A record honors only proofs minted after it began (ext_proc/edge/redis_record.py):
        # this server is new and no proof of the benchmark's key was honored before it,
        # so its record states it began a lifetime ago, on this server.
        began = int(time.time()) - 2 * (proofs.LIFETIME + 3 * proofs.SKEW)
        client = redis.Redis(host=LOCAL, port=address.port)
        try:
            redis_record.begin(client, began)
        finally:
            client.close()

    def record_url(self, arrangement: Arrangement) -> str:
        """The ``proof.record`` of ``arrangement``: "" (its own table), or its own
        redis-server."""
        if arrangement.record != "redis":
            return ""
        address = self.redis_addresses.get(arrangement.name)
        if address is None:
            raise RuntimeError("redis-server not started")
        return f"redis://{address}/0"

    def _start_arrangement(self, arrangement: Arrangement) -> Running:
        running = Running(
            arrangement,
            gateway=HostPort(LOCAL, processes.free_port()),
            admin=HostPort(LOCAL, processes.free_port()),
        )
        workers = 1
        if arrangement.kind == "service" and "--workers" in self.serve_options:
            workers = arrangement.workers or 1
        # Worker i serves the processor's port plus i.
        processor = HostPort(LOCAL, consecutive_free_ports(workers))
        log = self.workdir / f"{arrangement.name}-processor.log"
        if arrangement.kind == "naive":
            args = [sys.executable, "-m", "bench.naive", "--listen", str(processor)]
        elif arrangement.kind == "ledger":
            args = [sys.executable, "-m", "bench.ledger", "--listen", str(processor)]
            args += ["--rung", arrangement.rung, "--config", str(self._settings(arrangement))]
        elif arrangement.kind == "service":
            args = [sys.executable, "-m", "ext_proc", "serve", "--listen", str(processor)]
            if "--workers" in self.serve_options and arrangement.workers is not None:
                args += ["--workers", str(workers)]
            if "--metrics-listen" in self.serve_options:
                # Each service its own metrics port: the default one is shared.
                running.metrics = HostPort(LOCAL, processes.free_port())
                args += ["--metrics-listen", str(running.metrics)]
            args += ["--config", str(self._settings(arrangement))]
        else:
            args = []
        if args:
            env = arrangement.environment()
            running.processor = processes.start(args, log, cwd=REPO, env=env)
            self._children.append(running.processor)
            for address in worker_ports(str(processor), workers):
                processes.wait_for_port(HostPort.parse(address).port, running.processor)
        config = envoy_config.render(
            gateway=running.gateway,
            admin=running.admin,
            processor=processor,
            aggregated=self.upstream,
            disaggregated=self.upstream,
            source=envoy_config.SHIPPED.parent / arrangement.config,
        )
        list_workers(config, processor, workers)
        _add_any_caller_route(config)
        _add_strict_route(config)
        if arrangement.kind == "direct":
            _remove_ext_proc(config, arrangement.rung or "log")
        elif arrangement.kind == "naive" and arrangement.rung:
            cut_envoy(config, arrangement.rung)
        path = envoy_config.write(config, self.workdir / f"{arrangement.name}-envoy.yaml")
        # The access log goes to stdout: formatted as shipped, then discarded.
        args = [*processes.envoy_args(path, running.admin.port)]
        args += ["--concurrency", str(self.envoy_concurrency)]
        running.envoy = processes.start(
            args, self.workdir / f"{arrangement.name}-envoy.log", cwd=REPO, quiet_stdout=True
        )
        self._children.append(running.envoy)
        processes.wait_for_envoy(running.admin.port, running.envoy)
        return running

    def _settings(self, arrangement: Arrangement) -> Path:
        """The processor's config file: the benchmark's keys and lifetimes, its record."""
        path = self.workdir / f"{arrangement.name}-processor.yaml"
        settings = proofs.processor_config(
            self.workdir,
            record_url=self.record_url(arrangement),
            record_slots=self.record_slots,
        )
        path.write_text(yaml.safe_dump(settings))
        return path

    @property
    def upstream_pid(self) -> int:
        if self.nginx_process is None:
            raise RuntimeError("nginx not started")
        return self.nginx_process.pid

    def processor_pid(self, name: str) -> int:
        processor = self.running[name].processor
        if processor is None:
            raise ValueError(f"{name} has no processor")
        return processor.pid

    def stop(self) -> None:
        for child in reversed(self._children):
            with contextlib.suppress(OSError):
                processes.stop(child)
        self._children.clear()


def consecutive_free_ports(count: int) -> int:
    """A port from which ``count`` ports are free on loopback (each checked by binding
    it; another process may still take one before its worker does)."""
    for _ in range(50):
        base = processes.free_port()
        if base + count - 1 > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base + 1, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind((LOCAL, port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports on {LOCAL}")


def list_workers(config: dict[str, Any], processor: HostPort, workers: int) -> None:
    """The processor cluster of a rendered config lists each of ``workers`` workers
    serving from ``processor``'s port, as envoygen's ``processor_workers`` does."""
    (cluster,) = [
        c for c in config["static_resources"]["clusters"] if c["name"] == envoygen.PROCESSOR_CLUSTER
    ]
    cluster.update(envoygen.processor_workers_fields(processor, workers))


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def _add_route_copy(
    config: dict[str, Any], source: str, name: str, prefix: str, **policy: object
) -> None:
    """A copy of the shipped route ``source`` under ``name`` and ``prefix``, with more
    ``policy`` metadata, placed just before it (and before the 404 of the endpoints the
    source refuses), after a copy of that 404 for its own prefix."""
    (vhost,) = _hcm(config)["route_config"]["virtual_hosts"]
    routes: list[dict[str, Any]] = vhost["routes"]
    index = next(i for i, r in enumerate(routes) if r.get("name") == source)
    extra = copy.deepcopy(routes[index])
    extra["name"] = name
    extra["match"] = {"prefix": prefix}
    extra["metadata"]["filter_metadata"][POLICY].update(policy)
    # Its metadata states its own prefix, not the copied route's.
    envoygen.state_rewrite(extra, POLICY)
    refused = copy.deepcopy(routes[index - 1])
    assert refused["name"] == f"{envoygen.RESERVED_ROUTE_PREFIX}-{source}-refused"
    refused["name"] = f"{envoygen.RESERVED_ROUTE_PREFIX}-{name}-refused"
    rewrite = extra["route"].get("prefix_rewrite")
    regex = refused_paths.route_regex(prefix, rewrite, refused_paths.refused_names(()))
    refused["match"] = {"safe_regex": {"regex": regex}}
    routes[index - 1 : index - 1] = [refused, extra]


def _add_any_caller_route(config: dict[str, Any]) -> None:
    """``/pd-any/v1/``: a copy of the shipped decode route that honors any caller's ids
    (the unproven honor)."""
    _add_route_copy(
        config,
        DECODE_ROUTE,
        "disaggregated-any-caller",
        bodies.ANY_CALLER_ROUTE,
        trust_any_caller=True,
    )


def _add_strict_route(config: dict[str, Any]) -> None:
    """``/strict/v1/``: a copy of the shipped aggregated route that forwards only the
    members its engine declares (``strict_body``). The upstream sees the prefix as
    sent: a strict route finds the endpoint's model behind any root path."""
    _add_route_copy(
        config,
        AGGREGATED_ROUTE,
        "aggregated-strict",
        bodies.STRICT_ROUTE,
        strict_body=bodies.STRICT_ENGINE,
    )


# The Envoy side of the cost ledger, in order: each rung's config has the one before's
# pieces and one more. "bare": Envoy direct without the 404 routes of the token
# endpoints and without the access log; "routes": with the routes; "log": with the
# access log (Envoy direct as measured everywhere); "header_step": with this project's
# header step; "ext_proc": with the ext_proc filter and its hold in front of the floor,
# but no request attributes; "attributes": with them (the floor, naive-1msg).
ENVOY_RUNGS = ("bare", "routes", "log", "header_step", "ext_proc", "attributes")
ENVOY_ADDS = {
    "bare": "Envoy alone: the router, no access log, no 404 routes",
    "routes": "the 404 routes of the token endpoints and of each route's refused endpoints "
    "(regular expressions)",
    "log": "the access log (Envoy direct)",
    "header_step": "the header step (carrier headers removed, request ids)",
    "ext_proc": "ext_proc and the buffer filter, in front of the floor, no attributes",
    "attributes": "the request attributes (the floor)",
}


# The compiled ladder's service rungs (EXT_PROC_NATIVE values, ext_proc/core/native.py),
# each compiling what the one before did and one piece more; the shipped default (every
# part compiled, the variable unset) tops it. What each adds, by value ("" the default).
COMPILED_RUNGS = ("0", "core._scan", "core._scan,edge._wire")
COMPILED_ADDS = {
    "0": "the service, every compiled part's pure-Python reference running instead",
    "core._scan": "core._scan compiled: the carrier scan of the body's bytes",
    "core._scan,edge._wire": "edge._wire compiled: the wire reader of the raw message bytes",
    "": "core._shape and core._ids compiled: the body's shape and the id checks "
    "(every part compiled: the shipped default)",
}


def cut_envoy(config: dict[str, Any], rung: str) -> None:
    """Remove from a rendered config every piece above Envoy rung ``rung``."""
    above = ENVOY_RUNGS[ENVOY_RUNGS.index(rung) + 1 :]
    hcm = _hcm(config)
    filters = hcm["http_filters"]
    if "attributes" in above:
        for f in filters:
            if f["name"] == envoygen.EXT_PROC_FILTER:
                f["typed_config"].pop("request_attributes", None)
    if "ext_proc" in above:
        dropped = (envoygen.EXT_PROC_FILTER, envoygen.BUFFER_FILTER)
        hcm["http_filters"] = filters = [f for f in filters if f["name"] not in dropped]
    if "header_step" in above:
        hcm["http_filters"] = [f for f in filters if f["name"] != carrier_headers.FILTER]
    if "log" in above:
        hcm.pop("access_log", None)
    if "routes" in above:
        (vhost,) = hcm["route_config"]["virtual_hosts"]
        vhost["routes"] = [r for r in vhost["routes"] if "direct_response" not in r]


def _remove_ext_proc(config: dict[str, Any], rung: str) -> None:
    """Envoy direct: this project's filters (the header step, ext_proc and the buffer
    filter that holds the request for it, whose cost is the processor's arrangement's)
    go, and what the ledger's Envoy ``rung`` leaves out."""
    names = [f["name"] for f in _hcm(config)["http_filters"]]
    if names.count(envoygen.EXT_PROC_FILTER) != 1:
        raise ValueError("the shipped config no longer has exactly one ext_proc filter")
    if ENVOY_RUNGS.index(rung) > ENVOY_RUNGS.index("header_step"):
        raise ValueError(f"Envoy direct has no processor: rung {rung!r} needs one")
    cut_envoy(config, rung)


def probe(gateway: HostPort, path: str, body: bytes) -> int:
    """The status of one request, for checking each arrangement before measuring."""
    connection = http.client.HTTPConnection(gateway.host, gateway.port, timeout=30)
    try:
        connection.request("POST", path, body, {"content-type": "application/json"})
        reply = connection.getresponse()
        reply.read()
        return reply.status
    finally:
        connection.close()
