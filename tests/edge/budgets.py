"""Work budgets: what one request costs the servicer, counted, never timed.

Each path is one request of the benchmark (``bench/bodies.py``'s bytes, sent as
``envoy/envoy.yaml`` sends it: one message with the body and the route's attributes)
served by the real ``ExternalProcessor.Process``, from the message's bytes to the
answers' bytes, its decision counted and logged as ``serve`` configures it. A stand-in
for gRPC's call hands the bytes over and takes the answers' bytes, as gRPC does with
the servicer registered without a deserializer or serializer; its read and write
(three Python calls) are counted with the servicer.
Counted:

- ``python_calls``: Python function calls (generators and coroutines resumed included);
- ``c_calls``: calls of C functions from Python code;
- ``bulk``: of those calls (and of the functions of ``json`` itself), the ones that can
  go over a whole buffer in one call (parsing, serializing, searching, counting,
  translating, decoding, hashing, numpy, the project's compiled parts), by name,
  whatever the size of what they were given: another pass over the body, or a second
  parse, is one more of them;
- for the 1 MiB paths, with tracemalloc: ``peak_bodies``, the most memory held at once
  above what was held before the request, and ``allocated_bodies``, the sum of every
  rise of at least a sixteenth of the body between two consecutive calls or returns
  (copies of the body made and dropped, which the peak may not show), both in bodies.
  tracemalloc sees Python's allocators and numpy's arrays, not protobuf's arenas: the
  body inside the decoded message is not counted, the copy the decoder takes of it is.

Calls are counted with ``sys.setprofile``; nothing is timed, so the counts are the same
from run to run, process to process (whatever the hash seed) and machine to machine for
one Python and one set of dependencies (the budgets file records the versions it was
measured with). The collector is off while a request is measured. Work done once per
second (the log line's date, the check of the key files, the batched log lines'
write) would add to one request now and then: each counter is the smallest of a few
requests in a row, of which at most one pays it.

``python -m tests.edge.budgets`` measures every path in a fresh process and shows it
beside its budget; ``--write`` records the measurement as the budgets
(``tests/edge/budgets.json``); ``--functions`` lists every C function each path calls;
``--json`` prints the measurement (``test_service_budget.py`` reads it).
docs/testing.md says how to raise a budget honestly.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.metadata
import io
import json
import logging
import platform
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, cast

import grpc
import yaml

from bench import bodies, proofs, stack
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import native
from ext_proc.core.config import Config
from ext_proc.edge import attributes, logs
from ext_proc.edge.record import LocalRecord
from ext_proc.edge.service import ExternalProcessor
from tests.driver import DAY
from tests.messages import first_body_request, route_attributes

ROOT: Final = Path(__file__).resolve().parents[2]
BUDGETS: Final = Path(__file__).with_name("budgets.json")
SHIPPED: Final = ROOT / "envoy" / "envoy.yaml"
# The paths: (size, decision) of bench/bodies.py.
PATHS: Final = {
    "allow-2k": ("2k", "allow"),
    "strip-2k": ("2k", "strip"),
    "deny-2k": ("2k", "deny"),
    "honor-1m": ("1m", "honor"),
    "honor-proven-1m": ("1m", "honor-proven"),
}
# The paths whose memory is measured: at 2 KiB a copy of the body is lost among the
# request's other objects, which a sixteenth of the body would not tell apart.
MEMORY_PATHS: Final = ("honor-1m", "honor-proven-1m")
# Margins: a budget is a measurement, and a path is within it when it measures
# within these of it, either way (work removed is a budget to lower).
CALL_MARGIN: Final = 0.05  # of the budget's calls
MEMORY_MARGIN: Final = 0.25  # bodies
# Requests served before any is measured (caches, memos, metric children, the
# decoder's memo of the route's attributes), and requests measured (the smallest
# counts are kept: see the module docstring).
WARM_UP: Final = 3
MEASURED: Final = 5
# The packages whose C functions are bulk operations whatever their name (as ``_name``
# spells them: ``_hashlib`` is ``hashlib``), and the methods of built-in types that go
# over their whole object.
BULK_PACKAGES: Final = frozenset(
    {"orjson", "json", "re", "stringzilla", "numpy", "blake3", "blake2", "hashlib"}
    | {"binascii", "zlib", "base64"}
)
BULK_METHODS: Final = frozenset(
    f"{kind}.{method}"
    for kind in ("bytes", "bytearray", "str", "memoryview")
    for method in (
        *("count", "find", "rfind", "index", "rindex", "translate", "decode", "encode"),
        *("join", "replace", "split", "rsplit", "splitlines", "tobytes", "hex"),
        *("lower", "upper", "isascii"),
    )
)
# The project's compiled parts (ext_proc.core.native): each call is a pass over a buffer.
_PACKAGE: Final = "ext_proc"
_COMPILED: Final = tuple(f"{_PACKAGE}.{part}." for part in native.PARTS)
# The dependencies whose code runs on the paths, recorded with the budgets.
DEPENDENCIES: Final = ("protobuf", "orjson", "numpy", "stringzilla", "blake3", "prometheus-client")


@dataclass
class Counts:
    """One path's counters (``peak_bodies`` and ``allocated_bodies`` on the memory
    paths only)."""

    python_calls: int
    c_calls: int
    bulk: dict[str, int]
    peak_bodies: float | None = None
    allocated_bodies: float | None = None
    # Every C function called, by name: for reading, not budgeted.
    c_functions: dict[str, int] = field(default_factory=dict, compare=False)

    def budget(self) -> dict[str, Any]:
        """What the budgets file keeps of it."""
        kept = asdict(self)
        del kept["c_functions"]
        return {k: v for k, v in kept.items() if v is not None}


# --- the requests ------------------------------------------------------------------------


@functools.cache
def shipped_routes() -> list[dict[str, Any]]:
    """The routes of envoy/envoy.yaml with the benchmark's ``/pd-any/v1/`` route, as
    bench/stack.py adds it (read once: callers only read them)."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    stack._add_any_caller_route(config)
    (vhost,) = stack._hcm(config)["route_config"]["virtual_hosts"]
    routes: list[dict[str, Any]] = vhost["routes"]
    return routes


def _route(routes: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """The first route whose prefix begins ``path`` (the regex routes before them
    answer the token endpoints, which no path of the benchmark is)."""
    for route in routes:
        prefix = route["match"].get("prefix")
        if prefix is not None and path.startswith(prefix):
            return route
    raise LookupError(f"no route for {path}")


def request(
    routes: list[dict[str, Any]], path: str, data: bytes, number: int
) -> pb.ProcessingRequest:
    """The message Envoy sends for ``data`` posted to ``path``: the route's policy
    fields as CEL renders them, its name, the path, a connection without TLS, and the
    headers the processor checks (the request id Envoy's header step gives it)."""
    route = _route(routes, path)
    policy = route["metadata"]["filter_metadata"][stack.POLICY]
    values = {
        **route_attributes({name: attributes.as_cel(value) for name, value in policy.items()}),
        attributes.ROUTE_NAME: route["name"],
        attributes.PATH: path,
        attributes.PEER["mtls"]: False,
        attributes.HEADERS["content-type"]: "application/json",
        attributes.HEADERS["content-length"]: str(len(data)),
        attributes.HEADERS["x-request-id"]: str(uuid.UUID(int=number)),
    }
    return first_body_request(data, values)


# --- one request through the servicer ----------------------------------------------------


class _Call:
    """Stands in for grpc.aio's call context: ``read`` hands over the one message's
    bytes, then the end of the stream; ``write`` keeps each answer's bytes."""

    def __init__(self, message: bytes) -> None:
        self._message: object = message
        self.sent: list[bytes] = []

    async def read(self) -> object:
        message, self._message = self._message, grpc.aio.EOF
        return message

    async def write(self, response: bytes) -> None:
        self.sent.append(response)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"the stream was aborted: {details}")


_Hook = Callable[[FrameType, str, Any], None]


def _serve(processor: ExternalProcessor, call: _Call, hook: _Hook | None = None) -> None:
    """``processor.Process`` over ``call``, with ``hook`` as the profiler while it runs.
    Every await on these paths completes at once (the stand-in's read and write, the
    local record's spend), so the coroutine runs to its end in one ``send``, with no
    event loop whose own work would be counted. The hook sees that ``send`` and the
    call that removes it, and nothing else of this function."""
    # The servicer reads through the call: its request iterator stays unread.
    unread = cast("AsyncIterator[bytes]", iter(()))
    coroutine = processor.Process(unread, call)
    sys.setprofile(hook)
    try:
        coroutine.send(None)
    except StopIteration:
        return
    finally:
        sys.setprofile(None)
    coroutine.close()
    raise AssertionError("the servicer waited for something")


@contextlib.contextmanager
def _production_logging() -> Iterator[None]:
    """Logging as ``python -m ext_proc serve`` configures it (``logs.configure``), the
    lines kept in memory; everything restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    flags = (
        logging._srcfile,
        logging.logThreads,
        logging.logProcesses,
        logging.logMultiprocessing,
    )
    logs.configure("info")
    (handler,) = root.handlers
    assert isinstance(handler, logs.JsonHandler)
    handler.setStream(io.StringIO())
    try:
        yield
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        (
            logging._srcfile,
            logging.logThreads,
            logging.logProcesses,
            logging.logMultiprocessing,
        ) = flags


class _Path:
    """A servicer with the settings the benchmark gives ``python -m ext_proc serve``
    (``proofs.processor_config``: its key, lifetimes and record of spent proofs), and
    the requests of one path."""

    def __init__(self, name: str, folder: Path) -> None:
        size, decision = PATHS[name]
        self.body = bodies.build(size, decision)
        config = Config.load(environ={}, **proofs.processor_config(folder))
        # A processor that has run for a day: its record began before the proofs.
        record = LocalRecord.anonymous(config.proof.record_slots, began=time.time() - DAY)
        self.processor = ExternalProcessor(config, record=record)
        self._routes = shipped_routes()
        self._served = 0
        needed = WARM_UP + 2 * MEASURED + 1  # the requests ``measure`` serves
        if self.body.proof_at is None:
            self._tokens: list[bytes] = []
        else:  # a proof is honored once: one of the pool per request, as the bench sends
            pool = proofs.mint_pool(self.body.data, needed)
            width = proofs.WIDTH
            self._tokens = [pool[i : i + width] for i in range(0, len(pool), width)]

    def next_call(self) -> _Call:
        """The next request's call (its message made before anything is counted)."""
        if self.body.proof_at is None:
            data = self.body.data
        else:
            data = self.body.with_proof(self._tokens.pop())
        self._served += 1
        message = request(self._routes, self.body.path, data, self._served)
        return _Call(message.SerializeToString())

    def check(self, call: _Call) -> None:
        """The request was decided as its body intends."""
        answer = pb.ProcessingResponse.FromString(call.sent[-1])
        decision = answer.dynamic_metadata.fields[stack.POLICY].struct_value
        reason = decision.fields["reason"].string_value
        assert reason == self.body.expected_reason, (self.body.decision, reason)


# --- counting --------------------------------------------------------------------------


def _name(function: Any) -> str:
    """A C function's name: its package and qualified name (``orjson.loads``,
    ``numpy.ndarray.astype``, ``re.Pattern.findall``), a built-in type's method by the
    type (``bytes.decode``), a compiled part's by its module (``ext_proc.core._ids.read``)."""
    module = getattr(function, "__module__", None)
    if module is None:
        module = type(getattr(function, "__self__", None)).__module__
    if module and module.startswith(f"{_PACKAGE}."):
        return f"{module}.{function.__qualname__}"
    package = module.split(".")[0].lstrip("_") if module else ""
    if package == "builtins" or not package:
        return str(function.__qualname__)
    if package == "sre":
        package = "re"
    return f"{package}.{function.__qualname__}"


def _bulk(name: str) -> bool:
    if name.startswith("re.Match."):  # a match's groups and bounds, read in place
        return False
    if name.startswith(_COMPILED):  # each goes over a message, a body or its ids
        return True
    return name in BULK_METHODS or name.split(".", maxsplit=1)[0] in BULK_PACKAGES


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No collection while a request is measured: when the collector runs depends on
    everything allocated before."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _count_calls(processor: ExternalProcessor, call: _Call) -> Counts:
    python = 0
    c_functions: Counter[str] = Counter()
    bulk: Counter[str] = Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal python
        if event == "call":
            python += 1
            if frame.f_globals.get("__name__") == "json":  # json.loads, json.dumps
                bulk[f"json.{frame.f_code.co_qualname}"] += 1
        elif event == "c_call":
            name = _name(arg)
            c_functions[name] += 1
            if _bulk(name):
                bulk[name] += 1

    with _quiet():
        _serve(processor, call, hook)
    c_functions.subtract(("coroutine.send", "sys.setprofile"))  # _serve's own
    c_functions = +c_functions
    return Counts(python, sum(c_functions.values()), dict(bulk), c_functions=dict(c_functions))


def _measure_memory(processor: ExternalProcessor, call: _Call, size: int) -> tuple[float, float]:
    """``peak_bodies`` and ``allocated_bodies`` of one request of ``size`` bytes. Between
    two consecutive calls or returns, the highest traced memory above where it stood
    at the first is a rise; a copy made and dropped between them is one too."""
    threshold = size // 16
    allocated = 0
    highest = 0
    last = 0

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal allocated, highest, last
        current, peak = tracemalloc.get_traced_memory()
        if peak - last >= threshold:
            allocated += peak - last
        highest = max(highest, peak)
        tracemalloc.reset_peak()
        last = current

    with _quiet():
        tracemalloc.start()
        try:
            start = last = highest = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            _serve(processor, call, hook)
            highest = max(highest, tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return round((highest - start) / size, 2), round(allocated / size, 2)


def measure(name: str, *, memory: bool = True) -> Counts:
    """One request of path ``name``, after the warm-up; the smallest of ``MEASURED``
    requests counted (and as many measured for memory, on the memory paths)."""
    with tempfile.TemporaryDirectory() as folder, _production_logging():
        path = _Path(name, Path(folder))
        for _ in range(WARM_UP):
            call = path.next_call()
            _serve(path.processor, call)
            path.check(call)
        runs = []
        for _ in range(MEASURED):
            call = path.next_call()
            runs.append(_count_calls(path.processor, call))
            path.check(call)
        counts = min(runs, key=lambda c: (c.python_calls + c.c_calls, sorted(c.bulk.items())))
        if memory and name in MEMORY_PATHS:
            size = len(path.body.data)
            # The first request under tracemalloc pays for its start.
            _measure_memory(path.processor, path.next_call(), size)
            measured = []
            for _ in range(MEASURED):
                call = path.next_call()
                measured.append(_measure_memory(path.processor, call, size))
                path.check(call)
            counts.peak_bodies = min(peak for peak, _ in measured)
            counts.allocated_bodies = min(allocated for _, allocated in measured)
    return counts


# --- budgets -----------------------------------------------------------------------------


def environment() -> dict[str, str]:
    """The Python and the dependencies that the counts depend on."""
    found = {"python": platform.python_version()}
    for name in DEPENDENCIES:
        found[name] = importlib.metadata.version(name)
    return found


def load() -> dict[str, Any]:
    budgets: dict[str, Any] = json.loads(BUDGETS.read_text())
    return budgets


def out_of_budget(name: str, measured: Counts, budget: dict[str, Any]) -> list[str]:
    """Each counter of ``measured`` outside ``budget`` (with its margin), said with
    both numbers; empty when the path is within its budget."""
    found = []
    for counter in ("python_calls", "c_calls"):
        value, allowed = getattr(measured, counter), budget[counter]
        if abs(value - allowed) > CALL_MARGIN * allowed:
            found.append(f"{name}: {counter} {value}, budget {allowed} (±{CALL_MARGIN:.0%})")
    for operation in sorted(set(measured.bulk) | set(budget["bulk"])):
        value, allowed = measured.bulk.get(operation, 0), budget["bulk"].get(operation, 0)
        if value != allowed:
            found.append(f"{name}: bulk {operation} {value}, budget {allowed} (exact)")
    for counter in ("peak_bodies", "allocated_bodies"):
        value, allowed = getattr(measured, counter), budget.get(counter)
        if value is None and allowed is None:
            continue
        if value is None or allowed is None or abs(value - allowed) > MEMORY_MARGIN:
            found.append(f"{name}: {counter} {value}, budget {allowed} (±{MEMORY_MARGIN} bodies)")
    return found


def _write(measured: dict[str, Counts]) -> None:
    budgets = {
        "measured_with": environment(),
        "paths": {name: counts.budget() for name, counts in measured.items()},
    }
    BUDGETS.write_text(json.dumps(budgets, indent=2, sort_keys=True) + "\n")


def _line(name: str, counts: Counts, budget: dict[str, Any]) -> str:
    """One path's counters beside their budgets."""
    parts = [f"{name:16}"]
    for counter in ("python_calls", "c_calls", "peak_bodies", "allocated_bodies"):
        value = getattr(counts, counter)
        if value is not None:
            parts.append(f"{counter} {value} ({budget.get(counter)})")
    parts.append(f"bulk {sum(counts.bulk.values())} ({sum(budget['bulk'].values())})")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.edge.budgets",
        description="Measure the servicer's work per request beside its budgets.",
    )
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--write", action="store_true", help="record the measurement as the budgets")
    given.add_argument("--json", action="store_true", help="print the measurement as JSON")
    given.add_argument(
        "--functions", action="store_true", help="print every C function each path calls"
    )
    args = parser.parse_args(argv)
    measured = {name: measure(name) for name in PATHS}
    if args.json:
        print(json.dumps({name: asdict(counts) for name, counts in measured.items()}))
        return 0
    if args.write:
        _write(measured)
        print(f"wrote {BUDGETS.relative_to(ROOT)}")
        return 0
    if args.functions:
        for name, counts in measured.items():
            print(name)
            for function, count in sorted(counts.c_functions.items(), key=lambda f: (-f[1], f[0])):
                bulk = "  (bulk)" if _bulk(function) else ""
                print(f"  {count:4} {function}{bulk}")
        return 0
    budgets = load()["paths"]
    problems = []
    for name, counts in measured.items():
        print(_line(name, counts, budgets[name]))
        problems += out_of_budget(name, counts, budgets[name])
    print("\n".join(problems) or "every path within its budget (budgets in parentheses)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
