"""An Envoy configuration in the one spelling the rules read.

Envoy reads a configuration through protobuf's JSON mapping, which takes a field by its
proto name (``processing_mode``) or its JSON name (``processingMode``), an enum by its
name (``SKIP``) or its number (``2``), and a typed configuration packed in a
``TypedStruct`` as the message it names. The rules read proto names, enum names and the
message itself; a spelling they did not read would be a setting they never saw (a
tenant route skipping its headers, a filter failing open) and a pass Envoy does not
share. ``canonical`` rewrites the whole configuration into that one spelling before any
rule runs: field names to proto names, the enums the rules compare to their names (from
a number, a numeric string or a name in any case), the booleans they read to bools
(from a BoolValue message or any word yaml-cpp or the JSON mapping reads as one), type
URLs to the type they resolve to, ``TypedStruct`` unwrapped, null fields dropped. Map
keys (filter names, metadata namespaces, type names) are names, not fields, and the
policy metadata is the processor's, read by its own exact keys: both stay as written.
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
# Fields whose value is kept exactly as written: Struct values (a null in one is a
# value) and packed metadata read by their own keys (the policy metadata is the
# processor's to validate).
VERBATIM: Final = frozenset({"filter_metadata", "typed_filter_metadata", "json_format"})

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

# The boolean fields the rules read (plain bool or google.protobuf.BoolValue). Envoy
# takes a BoolValue as {"value": x} too, and reads YAML with yaml-cpp, whose booleans
# include y/n, yes/no and on/off in any case, and a JSON string "true"/"false": every
# such spelling is the bool here (one Envoy refuses, such as a quoted "n", only makes
# the check read a configuration Envoy will not load).
BOOLS: Final = frozenset(
    {
        "disabled",
        "keep_empty_value",
        "most_specific_header_mutations_wins",
        "failure_mode_allow",
        "observability_mode",
        "disable_immediate_response",
        "append",
        "case_sensitive",
        "normalize_path",
        "merge_slashes",
        "allow_all_routing",
        "allow_envoy",
        "disallow_all",
        "disallow_system",
        "disallow_is_error",
        "is_optional",
        "ignore_case",
        "invert_match",
        "validate_clusters",
        "use_http_header",
    }
)
_TRUE: Final = frozenset({"true", "y", "yes", "on"})
_FALSE: Final = frozenset({"false", "n", "no", "off"})
# Envoy resolves a type URL by its last segment, whatever comes before it.
TYPE_PREFIX: Final = "type.googleapis.com/"

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
        if value is None:
            continue  # null: the field not given
        name = proto_name(key) if isinstance(key, str) else key
        if name in out:
            twice.append(f"{where}.{name}")
        out[name] = _value(name, value, twice, f"{where}.{name}")
    if "@type" in out:
        out["@type"] = type_url(out["@type"])
    if out.get("@type") in TYPED_STRUCTS:
        return _unwrapped(out, twice, where)
    return out


def type_url(url: Any) -> Any:
    """``url`` as the rules compare it: the type it resolves to, under
    ``type.googleapis.com/`` (a URL without a slash Envoy refuses: kept)."""
    if not isinstance(url, str) or "/" not in url:
        return url
    return TYPE_PREFIX + url.rsplit("/", 1)[1]


def _value(name: Any, value: Any, twice: list[str], where: str) -> Any:
    if name in VERBATIM:
        return value
    if name in MAPS and isinstance(value, dict):
        return {key: _canonical(item, twice, f"{where}[{key!r}]") for key, item in value.items()}
    if name in BOOLS:
        # A name both a bool and a message elsewhere (header_mutation's ``append`` is a
        # HeaderValueOption): what is no bool is read as the message it is.
        value = _bool(value)
    names = ENUMS.get(name) if isinstance(name, str) else None
    if names is not None:
        value = _enum(value, names)
    return _canonical(value, twice, where)


def _bool(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"value"}:
        value = value["value"]  # a BoolValue as a message
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return value


def _enum(value: Any, names: tuple[str, ...]) -> Any:
    """An enum by its name: Envoy takes the name in any case and the number, also as a
    string."""
    if isinstance(value, str):
        spelt = value.strip()
        if spelt.isdigit():
            value = int(spelt)
        elif spelt.upper() in names:
            return spelt.upper()
    if type(value) is int and 0 <= value < len(names):
        return names[value]
    return value


def _unwrapped(typed: dict[str, Any], twice: list[str], where: str) -> Any:
    """A TypedStruct as the message it packs: ``@type`` its type_url, its value's
    fields beside it."""
    url, value = type_url(typed.get("type_url")), typed.get("value", {})
    if not isinstance(url, str) or not isinstance(value, dict):
        return typed
    return _canonical({"@type": url, **value}, twice, where)
