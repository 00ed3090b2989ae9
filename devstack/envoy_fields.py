"""``python -m devstack envoy-fields``: ext_proc/tools/check_envoy/envoy_fields.json, every
field of every Envoy message check-envoy walks (``coverage.WALKED``), read from
envoy-data-plane's message classes (installed with the ``envoy-config`` extra, so this
runs offline). ``field_classes`` classifies each field once; tests/tools/check_envoy/
test_coverage.py fails on a field it does not know, so a new Envoy release's field cannot
pass unseen."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any, Final

from envoy_data_plane.message_pool import default_message_pool

from ext_proc.tools.check_envoy.coverage import TABLE, WALKED

DISTRIBUTION: Final = "envoy-data-plane"
_PREFIX: Final = "type.googleapis.com/"


def _classes() -> dict[str, type]:
    """Each walked message's class, by the message's full name (the package's message
    pool names each class it has imported by its type URL)."""
    for name in WALKED:
        package = name.split(".")
        # The proto package: the lower-case segments (a nested message's parents are not).
        module = ".".join(p for p in package if p[:1].islower())
        importlib.import_module(f"envoy_data_plane.{module}")
    found = {
        url.removeprefix(_PREFIX): cls for cls, url in default_message_pool.type_to_url.items()
    }
    missing = sorted(set(WALKED) - set(found))
    if missing:
        raise LookupError(f"{DISTRIBUTION} has no message {', '.join(missing)}")
    return {name: found[name] for name in WALKED}


def _type(cls: type, field: str, names: dict[type, str]) -> str:
    meta = cls._betterproto.meta_by_field_name[field]  # type: ignore[attr-defined]
    if meta.proto_type == "map":
        value = cls._betterproto.cls_by_field.get(f"{field}.value")  # type: ignore[attr-defined]
        return f"map<string, {names.get(value, meta.map_meta[1].proto_type)}>"
    kind = meta.proto_type
    if kind == "message":
        target = cls._betterproto.cls_by_field.get(field)  # type: ignore[attr-defined]
        # A well-known type the package unwraps (Duration, BoolValue...) is a value.
        kind = names.get(target, f"message ({getattr(target, '__name__', target)})")
    return f"repeated {kind}" if meta.repeated else kind


def table() -> dict[str, Any]:
    classes = _classes()
    names = {
        cls: url.removeprefix(_PREFIX) for cls, url in default_message_pool.type_to_url.items()
    }
    return {
        "source": f"{DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}",
        "messages": {
            name: {f.name: _type(cls, f.name, names) for f in dataclasses.fields(cls)}
            for name, cls in classes.items()
        },
    }


def files() -> dict[Path, str]:
    return {TABLE: json.dumps(table(), indent=1, sort_keys=False) + "\n"}
