"""An Envoy configuration in the one spelling the rules read.

Envoy reads a configuration through protobuf's JSON mapping, which takes a field by its
proto name (``processing_mode``) or its JSON name (``processingMode``), an enum by its
name (``SKIP``) or its number (``2``), and a typed configuration packed in a
``TypedStruct`` as the message it names. The rules read proto names, enum names and the
message itself; a spelling they did not read would be a setting they never saw (a
tenant route skipping its headers, a filter failing open) and a pass Envoy does not
share. ``canonical`` rewrites the whole configuration into that one spelling before any
rule runs: field names to proto names, the enums the rules compare to their names,
``TypedStruct`` unwrapped. Map keys (filter names, metadata namespaces, type names) and
the policy metadata itself are names, not fields, and stay as written; the processor
reads its metadata by its own exact keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

# The two TypedStruct types Envoy unpacks as the message their type_url names.
TYPED_STRUCTS: Final = frozenset(
    {
        "type.googleapis.com/xds.type.v3.TypedStruct",
        "type.googleapis.com/udpa.type.v1.TypedStruct",
    }
)

# Fields whose value is a map: its keys are names, its values are configurations.
MAPS: Final = frozenset(
    {
        "typed_per_filter_config",
        "typed_extension_protocol_options",
        "providers",
        "requirement_map",
        "source_codes",
    }
)
# Fields whose value is kept exactly as written: Struct values and packed metadata read
# by their own keys (the policy metadata is the processor's to validate).
VERBATIM: Final = frozenset({"filter_metadata", "typed_filter_metadata"})

_HEADER_SEND: Final = ("DEFAULT", "SEND", "SKIP")
_BODY_SEND: Final = (
    "NONE",
    "STREAMED",
    "BUFFERED",
    "BUFFERED_PARTIAL",
    "FULL_DUPLEX_STREAMED",
    "GRPC",
)
# The enums the rules compare, by field name: each value's name at its number (the
# proto's; tests/tools/check_envoy/test_spelling.py compares them with Envoy's protos).
ENUMS: Final[Mapping[str, tuple[str, ...]]] = {
    "request_header_mode": _HEADER_SEND,
    "response_header_mode": _HEADER_SEND,
    "request_trailer_mode": _HEADER_SEND,
    "response_trailer_mode": _HEADER_SEND,
    "request_body_mode": _BODY_SEND,
    "response_body_mode": _BODY_SEND,
    "append_action": (
        "APPEND_IF_EXISTS_OR_ADD",
        "ADD_IF_ABSENT",
        "OVERWRITE_IF_EXISTS_OR_ADD",
        "OVERWRITE_IF_EXISTS",
    ),
    "path_with_escaped_slashes_action": (
        "IMPLEMENTATION_SPECIFIC_DEFAULT",
        "KEEP_UNCHANGED",
        "REJECT_REQUEST",
        "UNESCAPE_AND_REDIRECT",
        "UNESCAPE_AND_FORWARD",
    ),
    "headers_with_underscores_action": ("ALLOW", "REJECT_REQUEST", "DROP_HEADER"),
}

# A JSON name: lower camel case (a proto name has no capital).
_JSON_NAME: Final = re.compile(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+")
_CAPITAL: Final = re.compile(r"[A-Z]")


def proto_name(key: str) -> str:
    """A field's proto name from either spelling (``processingMode`` ->
    ``processing_mode``)."""
    if _JSON_NAME.fullmatch(key) is None:
        return key
    return _CAPITAL.sub(lambda found: "_" + found.group().lower(), key)


def canonical(config: Any) -> tuple[Any, list[str]]:
    """``config`` in the one spelling the rules read (a new value; ``config`` is not
    changed), and the fields spelt both ways in one message, by the names of what holds
    them: which of the two Envoy reads is not the rules' to guess."""
    twice: list[str] = []
    return _canonical(config, twice, ""), twice


def _canonical(config: Any, twice: list[str], where: str) -> Any:
    if isinstance(config, list):
        return [_canonical(item, twice, f"{where}[{i}]") for i, item in enumerate(config)]
    if not isinstance(config, dict):
        return config
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = proto_name(key) if isinstance(key, str) else key
        if name in out:
            twice.append(f"{where}.{name}")
        out[name] = _value(name, value, twice, f"{where}.{name}")
    if out.get("@type") in TYPED_STRUCTS:
        return _unwrapped(out, twice, where)
    return out


def _value(name: Any, value: Any, twice: list[str], where: str) -> Any:
    if name in VERBATIM:
        return value
    if name in MAPS and isinstance(value, dict):
        return {key: _canonical(item, twice, f"{where}[{key!r}]") for key, item in value.items()}
    names = ENUMS.get(name) if isinstance(name, str) else None
    if names is not None and type(value) is int and 0 <= value < len(names):
        return names[value]
    return _canonical(value, twice, where)


def _unwrapped(typed: dict[str, Any], twice: list[str], where: str) -> Any:
    """A TypedStruct as the message it packs: ``@type`` its type_url, its value's
    fields beside it."""
    url, value = typed.get("type_url"), typed.get("value", {})
    if not isinstance(url, str) or not isinstance(value, dict):
        return typed
    return _canonical({"@type": url, **value}, twice, where)
