"""Proof keys loaded from files, reloaded when a file changes (no restart).

A Kubernetes Secret mounted as a volume changes by an atomic symlink swap; ``stat``
follows the link, so a new mtime, size or inode means new contents. Files are checked at
most once per ``interval`` seconds, on use. A file that cannot be read, or holds fewer
than ``MIN_KEY_BYTES``, keeps its previous contents if it had any (logged), so a
half-written update never turns verification off; at start-up it is a configuration
error. Keys are never logged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from ext_proc.core.config import ConfigError, ProofKey
from ext_proc.core.proof import KeySet

log = logging.getLogger("ext_proc.keys")
MIN_KEY_BYTES: Final = 32


class KeyFileError(ConfigError):
    """A key file cannot be used; the message names the file, never its contents."""


def _read(path: Path, what: str = "proof key") -> bytes:
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} file {path}: {exc.strerror}") from None
    if len(secret) < MIN_KEY_BYTES:
        raise KeyFileError(f"{what} file {path} holds fewer than {MIN_KEY_BYTES} bytes")
    return secret


def tenant_key(path: str | None) -> bytes | None:
    """The tenant key (``tenants.key_file``), read once at start: a new key gives every
    tenant new salts (their cached prefixes are computed again), so it changes with a
    restart, never halfway through a conversation. None when none is configured."""
    return None if path is None else _read(Path(path), "tenant key")


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class KeyRing:
    """The configured key files; ``current()`` is the KeySet to sign and verify with."""

    def __init__(
        self,
        files: Sequence[ProofKey],
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = tuple(files)
        self._interval = interval
        self._clock = clock
        self._seen = {f.id: _signature(Path(f.file)) for f in self._files}
        self._secrets = {f.id: _read(Path(f.file)) for f in self._files}
        self._checked = clock()
        self._current = self._build()

    def _build(self) -> KeySet:
        signing = self._files[0].id if self._files else None
        return KeySet(dict(self._secrets), signing)

    def current(self) -> KeySet:
        now = self._clock()
        if self._files and now - self._checked >= self._interval:
            self._checked = now
            self._refresh()
        return self._current

    def _refresh(self) -> None:
        changed = False
        for key_file in self._files:
            seen = _signature(Path(key_file.file))
            if seen == self._seen[key_file.id]:
                continue
            self._seen[key_file.id] = seen
            try:
                self._secrets[key_file.id] = _read(Path(key_file.file))
            except KeyFileError as exc:
                log.error("proof key not reloaded; keeping the previous one: %s", exc)  # noqa: TRY400 - no traceback: the reason is the message
                continue
            changed = True
            log.info("proof key reloaded", extra={"key_id": key_file.id})
        if changed:
            self._current = self._build()
