"""What ``serve`` proves before it opens its port: every file it will read and every
service it will use works, so nothing reports SERVING (or ``make run`` ready) that
would then fail.

In order: the proof key files, read by the loader serving uses (``edge.keys``); the
Envoy configuration the processor serves, when given (``--envoy-config``): every
route's policy metadata read as check-envoy reads it, which is how the processor
reads it per request; the record of spent proofs, when it is a Redis that answers: it
can keep the record (``RedisRecord.check``). The first failure is one ``ConfigError``
line naming the file, route or setting.

A Redis that does not answer is an outage, not a configuration: ``serve`` logs it and
serves (every route that needs no record as ever; no proof is honored until the Redis
answers and can keep the record, ``edge.server.watch_record``). ``check-config
--connect`` asks for it to answer.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Final

from ext_proc.core.config import Config, ConfigError
from ext_proc.edge.keys import KeyRing
from ext_proc.edge.redis_record import RecordUnreachable, RedisRecord
from ext_proc.tools.check_envoy import reader
from ext_proc.tools.check_envoy.check import check

# The findings that are the processor's own reading of a route's metadata (a route
# with one answers every request 500), and a file that is no Envoy bootstrap at all.
POLICY_CODES: Final = frozenset({"policy-invalid", "policy-not-mapping", "no-connection-manager"})
log = logging.getLogger("ext_proc.record")


def keys(config: Config) -> None:
    """Every proof key file reads as serving reads it, or ``KeyFileError``."""
    KeyRing(config.proof.keys)


def routes(path: Path, namespace: str) -> None:
    """Every route's policy metadata in the Envoy configuration at ``path`` is valid,
    or ``ConfigError`` naming the file, the route and the field."""
    try:
        document = reader.load(path)
    except reader.Unreadable as exc:
        raise ConfigError(str(exc)) from None
    for finding in check(document, namespace).findings:
        if finding.code in POLICY_CODES:
            raise ConfigError(f"{path}: {finding.text}")


async def _record(config: Config, *, reach: bool) -> None:
    proof = config.proof
    record = RedisRecord(
        proof.record,
        proof.record_timeout_seconds,
        terms=proof.terms,
        password_file=proof.record_password_file,
    )
    try:
        await record.check()
    except RecordUnreachable as exc:
        if reach:
            raise
        log.warning(
            "proof record: serving without it; no proof is honored until Redis answers "
            "and can keep the record",
            extra={"store": "redis", "state": "unreachable", "detail": str(exc)},
        )
    finally:
        await record.close()


def record(config: Config, *, reach: bool = False) -> None:
    """A Redis record that answers can keep the record, or ``ConfigError``; one that
    does not answer is logged (``RecordUnreachable`` when ``reach``). The table a
    processor keeps itself needs nothing."""
    if config.proof.record:
        asyncio.run(_record(config, reach=reach))


def check_all(config: Config, envoy_config: Path | None) -> None:
    """Everything above, in order; ``ConfigError`` names the first failure."""
    keys(config)
    if envoy_config is not None:
        routes(envoy_config, config.route_metadata_namespace)
    record(config)
