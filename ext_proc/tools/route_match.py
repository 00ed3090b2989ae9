"""Envoy's route path matching and path rewriting, read as Envoy reads them, for
``check-envoy``.

A route's path matcher (``prefix``, ``path``, ``path_separated_prefix``, ``safe_regex``,
``path_match_policy`` with a URI template) becomes a ``PathMatcher``; a forwarding
route's rewrite (none, ``prefix_rewrite``, ``regex_rewrite``) the path its upstream
receives. Regular expressions are compiled and run by RE2, the library Envoy itself runs
them with (the ``google-re2`` binding, RE2's default options as Envoy's ``RE2::Quiet``):
Python's ``re`` reads some of them differently (``[[:alpha:]]`` is a nested set to it,
and ``(?i)`` after the start an error). Whatever cannot be read exactly (a pattern RE2
refuses, a matcher or rewrite not listed here, a URI template outside the grammar
below, a substitution with an empty match) raises ``Unreadable``: the check fails
rather than guess.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final, Literal

import re2

# The path a route matches against, by matcher: ``prefix`` sees the whole :path (query
# included), every other matcher the path without its query string.
Kind = Literal["prefix", "path", "path_separated_prefix", "safe_regex", "template"]
# Matchers whose paths are not a prefix or a single path: probes cannot be made from them.
PATTERNS: Final = frozenset({"safe_regex", "template"})
URI_TEMPLATE: Final = "envoy.path.match.uri_template.uri_template_matcher"
# Envoy's URI template grammar (source/extensions/path/uri_template_lib): the characters
# of a literal segment (RFC 3986 pchar without "*" and "="), one segment ("*"), any
# number of segments ("**").
_PCHAR: Final = "a-zA-Z0-9-._~%!$&'()+,;:@"
_ONE_SEGMENT: Final = f"[{_PCHAR}]+"
_SEGMENTS: Final = f"[{_PCHAR}/]*"
_LITERAL = re2.compile(f"[{_PCHAR}]+")
_NAME = re2.compile("[a-zA-Z][a-zA-Z0-9_]*")


class Unreadable(ValueError):
    """A route construct this module cannot evaluate exactly as Envoy does."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    return options


@functools.lru_cache(maxsize=256)
def compile_re2(pattern: str) -> Any:
    """``pattern`` compiled by RE2 as Envoy's ``safe_regex`` compiles it."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        raise Unreadable(f"RE2 cannot compile {pattern!r}: {exc}") from exc


def _bare(path: str) -> str:
    return path.partition("?")[0]


def _template_segment(segment: str) -> str:
    """One ``/``-separated part of a URI template as a regex (operators, ``{name}``,
    ``{name=ops}``, or a literal)."""
    if segment in ("*", "**"):
        return _ONE_SEGMENT if segment == "*" else _SEGMENTS
    if segment.startswith("{") and segment.endswith("}"):
        name, _, given = segment[1:-1].partition("=")
        if not _NAME.fullmatch(name):
            raise Unreadable(f"URI template variable {segment!r}")
        parts = given.split("/") if given else ["*"]
        return "/".join(_template_segment(part) for part in parts)
    if _LITERAL.fullmatch(segment):
        return str(re2.escape(segment))
    raise Unreadable(f"URI template segment {segment!r}")


def template_regex(template: str) -> str:
    """A URI template (``/v1/{model}/**``) as the RE2 pattern Envoy matches it with.
    Only templates of whole segments and one optional trailing ``/``: a suffix after a
    variable (``{x}.ts``) is refused."""
    if not template.startswith("/"):
        raise Unreadable(f"URI template {template!r} does not start with '/'")
    segments = template[1:].split("/")
    trailing = len(segments) > 1 and segments[-1] == ""
    if trailing:
        segments = segments[:-1]
    if "**" in "".join(segments[:-1]):
        raise Unreadable(f"URI template {template!r}: '**' before the last segment")
    body = "/".join(_template_segment(segment) for segment in segments)
    return f"/{body}{'/' if trailing else ''}"


@dataclass(frozen=True, slots=True)
class PathMatcher:
    """A route's path matcher: ``value`` is the prefix, the path, or the RE2 pattern
    (a URI template already converted)."""

    kind: Kind
    value: str
    case_sensitive: bool = True
    source: str = ""

    def matches(self, path: str) -> bool:
        """Whether Envoy's matcher matches ``path`` (after the connection manager's
        normalisation, query string included)."""
        if self.kind in PATTERNS:
            # RE2 full match on the path without its query string; case_sensitive does
            # not apply to either.
            return compile_re2(self.value).fullmatch(_bare(path)) is not None
        seen = path if self.kind == "prefix" else _bare(path)
        value = self.value
        if not self.case_sensitive:
            seen, value = seen.lower(), value.lower()
        if self.kind == "prefix":
            return seen.startswith(value)
        if self.kind == "path":
            return seen == value
        return seen == value or seen.startswith(f"{value}/")

    def head(self) -> str | None:
        """The literal start every matched path has (for probes): the prefix or path
        itself; for a pattern, None."""
        return None if self.kind in PATTERNS else self.value


def read_matcher(match: dict[str, Any]) -> PathMatcher:
    """The path matcher of a route's ``match``."""
    sensitive = bool(match.get("case_sensitive", True))
    for kind in ("prefix", "path", "path_separated_prefix"):
        if kind in match:
            return PathMatcher(kind, str(match[kind]), sensitive)
    if "safe_regex" in match:
        regex = match["safe_regex"].get("regex") if isinstance(match["safe_regex"], dict) else None
        if not isinstance(regex, str):
            raise Unreadable("safe_regex without a regex")
        compile_re2(regex)
        return PathMatcher("safe_regex", regex, sensitive, regex)
    if "path_match_policy" in match:
        policy = match["path_match_policy"]
        config = policy.get("typed_config", {}) if isinstance(policy, dict) else {}
        template = config.get("path_template") if isinstance(config, dict) else None
        if policy.get("name") != URI_TEMPLATE and not str(config.get("@type", "")).endswith(
            "UriTemplateMatchConfig"
        ):
            raise Unreadable(f"path_match_policy {policy.get('name')!r}")
        if not isinstance(template, str):
            raise Unreadable("path_match_policy without a path_template")
        regex = template_regex(template)
        compile_re2(regex)
        return PathMatcher("template", regex, sensitive, template)
    raise Unreadable(f"a path matcher of {sorted(match) or 'nothing'}")


def _substitute(substitution: str, groups: tuple[str | None, ...]) -> str:
    r"""RE2's rewrite string: ``\0`` to ``\9`` name groups, ``\\`` is a backslash;
    anything else after a backslash is refused (RE2 refuses it too)."""
    out: list[str] = []
    index = 0
    while index < len(substitution):
        char = substitution[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        following = substitution[index + 1 : index + 2]
        if following == "\\":
            out.append("\\")
        elif following.isdigit() and int(following) < len(groups):
            out.append(groups[int(following)] or "")
        else:
            raise Unreadable(f"regex_rewrite substitution {substitution!r}")
        index += 2
    return "".join(out)


def regex_rewrite(pattern: str, substitution: str, path: str) -> str:
    """Envoy's ``regex_rewrite``: ``RE2::GlobalReplace`` on the path without its query
    string (the query kept). A pattern that matches the empty string is refused: RE2
    steps over empty matches in its own way, not repeated here."""
    regex = compile_re2(pattern)
    bare, mark, query = path.partition("?")
    out: list[str] = []
    end = 0
    for found in regex.finditer(bare):
        start, stop = found.span()
        if start == stop:
            raise Unreadable(f"regex_rewrite {pattern!r} matches an empty string")
        groups = (found.group(0), *found.groups())
        out.append(bare[end:start] + _substitute(substitution, groups))
        end = stop
    return "".join(out) + bare[end:] + mark + query


def upstream_path(match: dict[str, Any], action: dict[str, Any], path: str) -> str:
    """The path a forwarding route (``match``, its ``route`` action) sends upstream for
    ``path``, which its matcher matched."""
    matcher = read_matcher(match)
    if action.get("prefix_rewrite"):
        if matcher.kind not in ("prefix", "path_separated_prefix"):
            raise Unreadable(f"prefix_rewrite with a {matcher.kind} matcher")
        return str(action["prefix_rewrite"]) + path[len(matcher.value) :]
    if "regex_rewrite" in action:
        rewrite = action["regex_rewrite"]
        try:
            pattern, substitution = rewrite["pattern"]["regex"], rewrite["substitution"]
        except (KeyError, TypeError) as exc:
            raise Unreadable("regex_rewrite without a pattern and a substitution") from exc
        return regex_rewrite(str(pattern), str(substitution), path)
    if "path_rewrite_policy" in action:
        raise Unreadable("path_rewrite_policy")
    return path
