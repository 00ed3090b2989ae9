"""What the components around vLLM that are not Python wheels read from a request: the
request headers and request-body paths in the sources of llm-d's router (the endpoint
picker and the coordinator), llm-d's routing sidecar, NVIDIA Dynamo's frontend and Ray
Serve LLM, each read at one git commit (``stacks.json``, beside this module).

Usage::

    python -m devstack.inventory stacks --tree NAME=GITDIR[@REV] ... [--out PATH]

NAME is a component of ``PLANS`` (``llm-d-router``, ``llm-d-sidecar``, ``dynamo``,
``ray-serve``); GITDIR is a bare clone of the component's repository, read with
``git ls-tree`` and ``git cat-file`` (no work tree, nothing built or run)::

    git clone --bare https://github.com/llm-d/llm-d-router GITDIR      # both llm-d components
    git clone --bare https://github.com/ai-dynamo/dynamo GITDIR
    git clone --bare https://github.com/ray-project/ray GITDIR

REV defaults to ``HEAD``. Each named component's source in the output file is replaced
(keyed ``"<name> <sha12>"``); every other source already there is kept. A source's
``refresh`` is the command that rebuilds it, with the clone as ``$GITDIR``.

How the reading works: every list comes out of the source text through the regular
expressions below, each stated as the invariant of the source it relies on; the only
hand-written parts are the reading plan of each component (which directories, which
decoded-body variables and which root types) in ``PLANS``. Comments are blanked before
any pattern runs (string literals kept); test files and generated protobuf code are not
read. Header names are lower-cased; body paths are dotted from the request's top level,
with ``*`` for a list item or a map value (``messages.*.content``). ``--explain`` prints
where each name was found.

What the patterns do not see, so a review of a new snapshot should: a header whose name
an operator configures without a default in the source (llm-d's session-affinity and
rollout headers), a body key read through a helper's parameter (a Go map handed to a
function), a flattened type from outside the files read, and any read written in a
shape none of the patterns states.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Final, TypeVar

DEFAULT_OUT: Final = Path(__file__).with_name("stacks.json")
GENERATED_BY: Final = "python -m devstack.inventory stacks"

# What a name looks like, so a constant that is some other string is never a header or
# a body member. Pseudo-headers (":path") are the request line, not headers.
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_JSON_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Evidence = dict[str, set[str]]  # name -> {"path:line", ...}
_T = TypeVar("_T")
_Key = tuple[str, str]  # (Go package directory, name)


class StacksError(Exception):
    """A tree that cannot be read: a missing git dir, revision or component."""


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise StacksError("git is not on PATH")
    return git


# --- reading a bare git directory ---------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """One commit of a bare git directory: its file list and file texts."""

    gitdir: Path
    commit: str

    @classmethod
    def open(cls, gitdir: Path, rev: str = "HEAD") -> Tree:
        done = subprocess.run(
            [
                _git(),
                "--git-dir",
                str(gitdir),
                "rev-parse",
                "--verify",
                "--quiet",
                rev + "^{commit}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        commit = done.stdout.strip()
        if done.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise StacksError(f"{gitdir}: no commit {rev!r}")
        return cls(gitdir, commit)

    def _git(self, *args: str, stdin: bytes | None = None) -> bytes:
        return subprocess.run(
            [_git(), "--git-dir", str(self.gitdir), *args],
            input=stdin,
            capture_output=True,
            check=True,
        ).stdout

    def paths(self, under: Sequence[str]) -> list[str]:
        out = self._git("ls-tree", "-r", "--name-only", "-z", self.commit, "--", *under)
        return sorted(p for p in out.decode().split("\0") if p)

    def read(self, paths: Sequence[str]) -> dict[str, str]:
        """The texts of ``paths`` at the commit, in one ``git cat-file --batch``."""
        if not paths:
            return {}
        request = "".join(f"{self.commit}:{p}\n" for p in paths).encode()
        out = self._git("cat-file", "--batch", stdin=request)
        texts: dict[str, str] = {}
        at = 0
        for path in paths:
            end = out.index(b"\n", at)
            header = out[at:end].split()
            at = end + 1
            if header[-1] == b"missing":
                continue
            size = int(header[2])
            texts[path] = out[at : at + size].decode("utf-8", "replace")
            at += size + 1
        return texts


# --- text helpers ----------------------------------------------------------------------


# The lexical tokens comments are told apart from strings with: a string literal (Go's
# raw strings, Go runes and Rust chars included, so ``'"'`` opens no string) is kept, a
# comment is blanked.
_C_TOKENS = re.compile(
    r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|\'(?:[^\'\\\n]|\\.)\'|(?P<comment>//[^\n]*|/\*.*?\*/)', re.S
)
_PY_TOKENS = re.compile(
    r"'''.*?'''|\"\"\".*?\"\"\"|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|(?P<comment>#[^\n]*)",
    re.S,
)


def blank_comments(text: str, *, python: bool = False) -> str:
    """``text`` with comments replaced by spaces (newlines kept, so line numbers hold):
    ``//`` and ``/* */`` for Go and Rust, ``#`` for Python. Strings are kept."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group()) if m.group("comment") else m.group()

    return (_PY_TOKENS if python else _C_TOKENS).sub(blank, text)


# Braces outside Go/Rust literals: what a block's extent is counted with.
_C_BRACES = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|\'(?:[^\'\\\n]|\\.)\'|[{}]')
_C_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|[\[\]]')


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _block(text: str, open_at: int) -> tuple[int, int]:
    """The span inside the brace at ``open_at`` up to its matching close."""
    depth = 0
    for m in _C_BRACES.finditer(text, open_at):
        if m.group() == "{":
            depth += 1
        elif m.group() == "}":
            depth -= 1
            if depth == 0:
                return open_at + 1, m.start()
    return open_at + 1, len(text)


def _unquote(literal: str) -> str:
    return literal.lstrip("bf")[1:-1]


def _add(evidence: Evidence, name: str, path: str, text: str, offset: int) -> None:
    evidence.setdefault(name, set()).add(f"{path}:{_line(text, offset)}")


def _join(prefix: str, step: str) -> str:
    return f"{prefix}.{step}" if prefix else step


def _steps(prefix: str, stars: str) -> str:
    """``prefix`` with one ``*`` step per character of ``stars``."""
    for _ in stars:
        prefix = _join(prefix, "*")
    return prefix


# --- Go ----------------------------------------------------------------------------------

# A Go package is a directory; its string constants are top-level ``Name = "value"``
# declarations (in ``const``/``var`` blocks or single), or aliases of another constant
# (``Name = pkg.Other``). Both are read only at brace depth 0, so a function's local
# assignment never stands for a package constant.
_GO_CONST = re.compile(
    r"^[ \t]*(?:(?:const|var)[ \t]+)?([A-Za-z_]\w*)(?:[ \t]+string)?[ \t]*=[ \t]*"
    r'"((?:[^"\\\n]|\\.)*)"[ \t]*$',
    re.M,
)
_GO_CONST_ALIAS = re.compile(
    r"^[ \t]*(?:const[ \t]+)?([A-Za-z_]\w*)[ \t]*=[ \t]*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)[ \t]*$",
    re.M,
)
# A package-level list of constants, ``name = []string{A, B}``: a ``for _, h := range``
# over it (or over a field whose default it is, ``defaultName``) reads each member.
_GO_LIST = re.compile(r"^[ \t]*(?:var[ \t]+)?([A-Za-z_]\w*)[ \t]*=[ \t]*\[\]string[ \t]*\{", re.M)
_GO_RANGE = re.compile(r"\bfor\s+(?:\w+|_)\s*,\s*(\w+)\s*:=\s*range\s+([A-Za-z_][\w.]*)")
_GO_IMPORT_BLOCK = re.compile(r"^import\s*\((.*?)\)", re.M | re.S)
_GO_IMPORT_ONE = re.compile(r'^import[ \t]+(?:([A-Za-z_]\w*|\.)[ \t]+)?"([^"]+)"', re.M)
_GO_IMPORT_SPEC = re.compile(r'^\s*(?:([A-Za-z_]\w*|\.)\s+)?"([^"]+)"\s*$', re.M)
_GO_MODULE = re.compile(r"^module\s+(\S+)", re.M)

# A key expression: a string literal, or an identifier that names a constant
# (``routing.PrefillEndpointHeader``) or a configured field (``h.headerName``).
_GO_KEY = r'"[^"\n]*"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*'

# Where Go code reads a request header:
# - net/http: ``r.Header.Get(k)`` / ``r.Header.Values(k)`` on a request (a receiver
#   named resp/response/res/w is a response);
# - the endpoint picker's lower-cased header map: ``request.Headers[k]``,
#   ``reqCtx.Request.Headers[k]``, a plain ``headers[k]``, read (not assigned);
# - its helpers ``ExtractHeaderValue(req, k)`` and ``GetLowerCaseHeaderValue(h, k)``.
_GO_HEADER_READS = (
    re.compile(
        r"(?<![\w.])(?!(?:resp|response|res|w)\.)[\w.]+\.Header\.(?:Get|Values)\(\s*("
        + _GO_KEY
        + r")\s*\)"
    ),
    re.compile(r"(?<![Rr]esponse)\.Headers\[\s*(" + _GO_KEY + r")\s*\](?!\s*=[^=])"),
    re.compile(r"(?<![\w.])headers\[\s*(" + _GO_KEY + r")\s*\](?!\s*=[^=])"),
    re.compile(r"HeaderValue\(\s*[^,()]+,\s*(" + _GO_KEY + r")\s*\)"),
)
# A header alias table: ``Key: {Key, OldKey}`` (a map literal of a header constant to
# the constants read in its place); an alias is read wherever its key is.
_GO_ALIAS_ROW = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\s*:\s*\{([^{}\n]*)\}")

# Go structs: ``type Name struct {...}``; a field ``Name Type `json:"name,..."```, an
# embedded type (one token) is flattened like encoding/json does. A field without a
# json tag is not a member: these code bases tag every member they decode, and a type
# that decodes itself has an ``UnmarshalJSON`` method, whose ``json.Unmarshal(data, &v)``
# targets (``var v T`` or ``var v struct {...}``) then give its members instead.
_GO_STRUCT = re.compile(r"^type[ \t]+([A-Za-z_]\w*)[ \t]+struct[ \t]*\{", re.M)
_GO_FIELD = re.compile(r"^\s*([A-Za-z_]\w*)\s+(\S.*?)\s*(?:`([^`]*)`)?\s*$")
_GO_EMBEDDED = re.compile(r"^\s*\*?([A-Za-z_][\w.]*)\s*(?:`([^`]*)`)?\s*$")
_GO_JSON_TAG = re.compile(r'json:"([^"]*)"')
_GO_UNMARSHAL = re.compile(r"^func[ \t]*\(\s*\w+\s+\*?([A-Za-z_]\w*)\s*\)\s*UnmarshalJSON\(", re.M)
_GO_UNMARSHAL_TARGET = re.compile(r"json\.Unmarshal\(\s*\w+\s*,\s*&(\w+)\s*\)")

# Reads of a decoded body held as ``map[string]any``: ``v[k]`` (not assigned, not in
# ``delete``) where ``v`` is one of the plan's body variables or was bound from one by
# ``x := v[k]`` / ``x, ok := v[k].(T)`` (x holds v.k), ``x, ok := v.(T)`` (x is v) or
# ``for _, x := range v`` (x is v.*), within one function; any other assignment to x
# ends its binding (a helper's parameter is not followed). A path the function itself
# assigned (``v[k] = ...``) is its own value when read after that, not the client's.
_GO_BIND_INDEX = re.compile(
    r"^\s*(?:(?:else\s+)?if\s+)?(\w+)(?:\s*,\s*\w+)?\s*:?=\s*([A-Za-z_][\w.]*)\[\s*("
    + _GO_KEY
    + r")\s*\]"
)
_GO_BIND_ASSERT = re.compile(
    r"^\s*(?:(?:else\s+)?if\s+)?(\w+)(?:\s*,\s*\w+)?\s*:?=\s*([A-Za-z_][\w.]*)\.\("
)
_GO_BIND_OTHER = re.compile(r"^\s*(?:(?:else\s+)?if\s+)?(\w+)(?:\s*,\s*\w+)?\s*:?=[^=]")
_GO_BIND_RANGE = re.compile(r"\bfor\s+(?:\w+|_)\s*,\s*(\w+)\s*:=\s*range\s+([A-Za-z_][\w.]*)")
_GO_WRITE = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\[\s*(" + _GO_KEY + r")\s*\]\s*=[^=]")
_GO_INDEX = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\[\s*(" + _GO_KEY + r")\s*\](?!\s*=[^=])")


@dataclass
class _GoFile:
    path: str
    text: str
    imports: dict[str, str]  # alias -> package directory in this repository ("" if none)

    @property
    def package(self) -> str:
        return str(PurePosixPath(self.path).parent)


@dataclass
class GoSource:
    """The Go files of a tree (tests and generated protobuf code left out), their
    package constants and structs."""

    files: dict[str, _GoFile]
    consts: dict[tuple[str, str], str] = field(default_factory=dict)
    aliases: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    lists: dict[tuple[str, str], tuple[str, list[str]]] = field(default_factory=dict)
    structs: dict[tuple[str, str], str] = field(default_factory=dict)  # -> struct body
    unmarshal: dict[tuple[str, str], str] = field(default_factory=dict)  # -> method body

    @classmethod
    def load(cls, texts: Mapping[str, str], go_mod: str = "") -> GoSource:
        module = m.group(1) if (m := _GO_MODULE.search(go_mod)) else ""
        files = {
            path: _GoFile(path, blank_comments(text), {})
            for path, text in texts.items()
            if _is_go_source(path)
        }
        source = cls(files)
        packages = {f.package for f in files.values()}
        for f in files.values():
            f.imports = _go_imports(f.text, module, packages)
            source._index(f)
        return source

    def _index(self, f: _GoFile) -> None:
        top = _top_level(f.text)
        for m in _GO_CONST.finditer(f.text):
            if top(m.start()):
                self.consts.setdefault((f.package, m.group(1)), m.group(2))
        for m in _GO_CONST_ALIAS.finditer(f.text):
            if top(m.start()):
                self.aliases.setdefault((f.package, m.group(1)), (f.path, m.group(2)))
        for m in _GO_LIST.finditer(f.text):
            if top(m.start()):
                start, end = _block(f.text, m.end() - 1)
                members = [x.strip() for x in f.text[start:end].split(",") if x.strip()]
                self.lists.setdefault((f.package, m.group(1)), (f.path, members))
        for m in _GO_STRUCT.finditer(f.text):
            start, end = _block(f.text, m.end() - 1)
            self.structs.setdefault((f.package, m.group(1)), f.text[start:end])
        for m in _GO_UNMARSHAL.finditer(f.text):
            start, end = _block(f.text, f.text.index("{", m.end()))
            self.unmarshal[(f.package, m.group(1))] = f.text[start:end]

    def resolve(self, f: _GoFile, key: str, _seen: frozenset[str] = frozenset()) -> str | None:
        """The string a key expression stands for in ``f``, or None."""
        if key.startswith('"'):
            return key[1:-1]
        if key in _seen:
            return None
        head, _, rest = key.partition(".")
        if not rest:
            package, name = f.package, key
        elif head in f.imports:
            package, name = f.imports[head], rest
        elif "." not in rest:
            # A configured field (``h.headerName``): its default, the package constant
            # named ``default<Field>`` (any case).
            wanted = "default" + rest.lower()
            for (pkg, const), value in self.consts.items():
                if pkg == f.package and const.lower() == wanted:
                    return value
            return None
        else:
            return None
        if (package, name) in self.consts:
            return self.consts[(package, name)]
        if (package, name) in self.aliases:
            origin, target = self.aliases[(package, name)]
            return self.resolve(self.files[origin], target, _seen | {key})
        return None

    def import_dir(self, package: str, qualifier: str) -> str:
        """The directory a package's files import as ``qualifier`` ("" if none)."""
        for f in self.files.values():
            if f.package == package and qualifier in f.imports:
                return f.imports[qualifier]
        return ""

    def resolve_list(self, f: _GoFile, expr: str) -> list[str]:
        """The strings of the list constant ``expr`` stands for in ``f`` (or [])."""
        head, _, rest = expr.partition(".")
        if not rest:
            key: tuple[str, str] | None = (f.package, expr)
        elif head in f.imports:
            key = (f.imports[head], rest)
        elif "." not in rest:
            wanted = "default" + rest.lower()
            key = next(
                (k for k in self.lists if k[0] == f.package and k[1].lower() == wanted), None
            )
        else:
            key = None
        if key not in self.lists:
            return []
        origin, members = self.lists[key]
        values = (self.resolve(self.files[origin], member) for member in members)
        return [v for v in values if v is not None]


def _is_go_source(path: str) -> bool:
    return (
        path.endswith(".go")
        and not path.endswith(("_test.go", ".pb.go"))
        and not re.search(r"(^|/)(test|tests|testdata|mocks|e2e|integration)/", path)
    )


def _go_imports(text: str, module: str, packages: set[str]) -> dict[str, str]:
    specs: list[tuple[str | None, str]] = [
        (m.group(1), m.group(2)) for m in _GO_IMPORT_ONE.finditer(text)
    ]
    for block in _GO_IMPORT_BLOCK.finditer(text):
        specs += [(m.group(1), m.group(2)) for m in _GO_IMPORT_SPEC.finditer(block.group(1))]
    imports: dict[str, str] = {}
    for alias, path in specs:
        local = path[len(module) + 1 :] if module and path.startswith(module + "/") else ""
        name = alias or path.rsplit("/", 1)[-1]
        imports[name] = local if local in packages else ""
    return imports


def _top_level(text: str) -> Callable[[int], bool]:
    """Whether an offset of ``text`` is outside every brace."""
    offsets: list[int] = []
    depths: list[int] = []
    depth = 0
    for m in _C_BRACES.finditer(text):
        if m.group() in ("{", "}"):
            depth += 1 if m.group() == "{" else -1
            offsets.append(m.start())
            depths.append(depth)

    def top(offset: int) -> bool:
        at = bisect.bisect_left(offsets, offset)
        return at == 0 or depths[at - 1] <= 0

    return top


def go_headers(source: GoSource, under: Sequence[str]) -> Evidence:
    """Header names read under the directories ``under``."""
    found: Evidence = {}
    for f in _within(source.files, under):
        for start, end in _go_functions(f.text):
            loops = {m.group(1): m.group(2) for m in _GO_RANGE.finditer(f.text, start, end)}
            for pattern in _GO_HEADER_READS:
                for m in pattern.finditer(f.text, start, end):
                    key = m.group(1)
                    if key in loops:
                        values = source.resolve_list(f, loops[key])
                    else:
                        values = [v] if (v := source.resolve(f, key)) else []
                    for value in filter(_HEADER_NAME.fullmatch, values):
                        _add(found, value.lower(), f.path, f.text, m.start())
    _go_alias_reads(source, under, found)
    return found


def _go_alias_reads(source: GoSource, under: Sequence[str], found: Evidence) -> None:
    """Adds to ``found`` the aliases of what it holds, by the alias tables under ``under``."""
    for f in _within(source.files, under):
        for m in _GO_ALIAS_ROW.finditer(f.text):
            key = source.resolve(f, m.group(1))
            if not key or key.lower() not in found:
                continue
            members = (source.resolve(f, x.strip()) for x in m.group(2).split(",") if x.strip())
            for value in members:
                if value and _HEADER_NAME.fullmatch(value):
                    _add(found, value.lower(), f.path, f.text, m.start())


def _within(files: Mapping[str, _T], under: Sequence[str]) -> Iterator[_T]:
    for path in sorted(files):
        if any(path == u or path.startswith(u.rstrip("/") + "/") for u in under):
            yield files[path]


@dataclass(frozen=True)
class GoRoot:
    """A Go request type the component decodes a body into: ``name`` in package
    directory ``package``; an ``envelope`` holds one member per API, each of whose
    types is a request body's top level (the member names are the envelope's own)."""

    package: str
    name: str
    envelope: bool = False


def go_struct_reads(source: GoSource, roots: Sequence[GoRoot]) -> Evidence:
    found: Evidence = {}
    for root in roots:
        body = source.structs.get((root.package, root.name))
        if body is None:
            continue
        walk = _GoStructWalk(source, root, found)
        if not root.envelope:
            walk.type(root.package, root.name, "", frozenset())
            continue
        for _, type_expr, tag in _go_fields(body):
            if (m := _GO_JSON_TAG.search(tag)) and m.group(1).split(",")[0] not in ("", "-"):
                walk.type(root.package, type_expr, "", frozenset())
    return found


def _go_fields(body: str) -> Iterator[tuple[str | None, str, str]]:
    """(field name, or None for an embedded type; type expression; tag) of each field;
    an anonymous ``struct {...}`` type is returned whole."""
    i = 0
    while i < len(body):
        end = body.find("\n", i)
        end = len(body) if end < 0 else end
        line = body[i:end]
        brace = line.find("struct {") if "struct {" in line else line.find("struct{")
        if brace >= 0 and "}" not in line[brace:]:
            start, close = _block(body, i + line.index("{", brace))
            tail_end = body.find("\n", close)
            tail_end = len(body) if tail_end < 0 else tail_end
            head = line[:brace].split()
            if head:
                steps = "".join(head[1:]).replace("*", "")
                yield (
                    head[0],
                    steps + "struct{" + body[start:close] + "}",
                    body[close + 1 : tail_end],
                )
            i = tail_end + 1
            continue
        if (m := _GO_FIELD.match(line)) and not line.strip().startswith("}"):
            yield m.group(1), m.group(2), m.group(3) or ""
        elif (m := _GO_EMBEDDED.match(line)) and m.group(1) != "}":
            yield None, m.group(1), m.group(2) or ""
        i = end + 1


@dataclass
class _GoStructWalk:
    """The JSON members reachable from one root type, into ``found``."""

    source: GoSource
    root: GoRoot
    found: Evidence

    def type(self, package: str, type_expr: str, prefix: str, seen: frozenset[_Key]) -> None:
        """The members of the type ``type_expr`` (written in ``package``) at ``prefix``."""
        type_expr = type_expr.strip()
        while True:
            if type_expr.startswith("*"):
                type_expr = type_expr[1:]
            elif type_expr.startswith("[]"):
                type_expr, prefix = type_expr[2:], _join(prefix, "*")
            elif m := re.match(r"map\[[^\]]*\]", type_expr):
                type_expr, prefix = type_expr[m.end() :], _join(prefix, "*")
            else:
                break
        if type_expr.startswith("struct{"):
            self.members(package, type_expr[7:-1], prefix, seen)
            return
        qualifier, _, name = type_expr.rpartition(".")
        key = (self.source.import_dir(package, qualifier) if qualifier else package, name)
        if key in seen or key not in self.source.structs:
            return
        if key in self.source.unmarshal:
            self.unmarshal(key, prefix, seen | {key})
        else:
            self.members(key[0], self.source.structs[key], prefix, seen | {key})

    def members(self, package: str, body: str, prefix: str, seen: frozenset[_Key]) -> None:
        for name, type_expr, tag in _go_fields(body):
            tag_name = m.group(1).split(",")[0] if (m := _GO_JSON_TAG.search(tag)) else ""
            if tag_name == "-":
                continue
            if name is None and not tag_name:
                self.type(package, type_expr, prefix, seen)  # embedded: flattened
            elif _JSON_KEY.fullmatch(tag_name):
                path = _join(prefix, tag_name)
                self.found.setdefault(path, set()).add(f"{self.root.package}/{self.root.name}")
                self.type(package, type_expr, path, seen)

    def unmarshal(self, key: _Key, prefix: str, seen: frozenset[_Key]) -> None:
        """The members of a type with its own ``UnmarshalJSON``: its decoding targets'."""
        method = self.source.unmarshal[key]
        for target in _GO_UNMARSHAL_TARGET.finditer(method):
            var = re.escape(target.group(1))
            if m := re.search(r"\bvar\s+" + var + r"\s+struct\s*\{", method):
                start, end = _block(method, m.end() - 1)
                self.members(key[0], method[start:end], prefix, seen)
            elif m := re.search(r"\bvar\s+" + var + r"\s+([^\s=]+)", method):
                self.type(key[0], m.group(1), prefix, seen)


@dataclass(frozen=True)
class GoMapReads:
    """Body reads through ``map[string]any`` variables under ``under``: ``roots`` name
    the variables that hold the decoded request body, ``key_functions`` the helpers
    called as ``f(bodyVar, "key", ...)`` that read those keys of it."""

    under: tuple[str, ...]
    roots: tuple[str, ...]
    key_functions: tuple[str, ...] = ()


def go_map_reads(source: GoSource, plan: GoMapReads) -> Evidence:
    found: Evidence = {}
    for f in _within(source.files, plan.under):
        for start, end in _go_functions(f.text):
            reads = _GoFunctionReads(source, f, plan, found)
            offset = start
            for line in f.text[start:end].splitlines(keepends=True):
                reads.line(line, offset)
                offset += len(line)
    return found


def _go_functions(text: str) -> Iterator[tuple[int, int]]:
    starts = [m.start() for m in re.finditer(r"^func\b", text, re.M)] + [len(text)]
    yield from itertools.pairwise(starts)


@dataclass
class _GoFunctionReads:
    """One function's reads of the body, line by line, into ``found``."""

    source: GoSource
    f: _GoFile
    plan: GoMapReads
    found: Evidence
    paths: dict[str, str] = field(default_factory=dict)  # variable -> body path it holds
    written: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.paths.update(dict.fromkeys(self.plan.roots, ""))

    def line(self, line: str, offset: int) -> None:
        target, bound = self._binding(line)
        if bound is not None:
            self.paths[target] = bound
        elif target in self.paths and target not in self.plan.roots:
            del self.paths[target]  # rebound to something that is not the body
        for m in _GO_INDEX.finditer(line):
            if not line[: m.start()].rstrip().endswith("delete("):
                self._read(m.group(1), m.group(2), offset + m.start())
        for m in _GO_WRITE.finditer(line):
            if (path := self._path(m.group(1), m.group(2))) is not None:
                self.written.add(path)
        for function in self.plan.key_functions:
            call = re.escape(function) + r"\(\s*([A-Za-z_][\w.]*)\s*,([^)]*)\)"
            for m in re.finditer(call, line):
                for arg in m.group(2).split(","):
                    self._read(m.group(1), arg.strip(), offset + m.start())

    def _path(self, variable: str, key_expr: str) -> str | None:
        key = self.source.resolve(self.f, key_expr)
        if variable not in self.paths or not key or not _JSON_KEY.fullmatch(key):
            return None
        return _join(self.paths[variable], key)

    def _read(self, variable: str, key_expr: str, offset: int) -> None:
        path = self._path(variable, key_expr)
        if path is not None and path not in self.written:
            _add(self.found, path, self.f.path, self.f.text, offset)

    def _binding(self, line: str) -> tuple[str, str | None]:
        """The variable ``line`` binds and the body path it then holds (None: not one)."""
        if m := _GO_BIND_RANGE.search(line):
            held = self.paths.get(m.group(2))
            return m.group(1), None if held is None else _join(held, "*")
        if m := _GO_BIND_INDEX.match(line):
            return m.group(1), self._path(m.group(2), m.group(3))
        if m := _GO_BIND_ASSERT.match(line):
            return m.group(1), self.paths.get(m.group(2))
        if m := _GO_BIND_OTHER.match(line):
            return m.group(1), None
        return "", None


# --- Rust --------------------------------------------------------------------------------

# ``const NAME: &str = "value";`` (any visibility): the way Dynamo names its headers.
_RUST_CONST = re.compile(
    r'\bconst\s+([A-Z_][A-Z0-9_]*)\s*:\s*&\s*(?:\'static\s+)?str\s*=\s*"((?:[^"\\]|\\.)*)"\s*;'
)
_RUST_KEY = r'"[^"\n]*"|[A-Za-z_][\w]*(?:::[A-Za-z_]\w*)*'
# Where Rust code reads a request header:
# - ``headers.get(k)`` / ``get_all`` / ``contains_key`` on an http ``HeaderMap`` reached
#   as ``…headers`` or ``…headers()`` (whitespace and line breaks allowed, as in a
#   ``.or_else(|| headers.get(ALIAS))`` chain);
# - a helper called with the map and a name, ``value(headers, k)``;
# - a table row naming the header a helper then reads, a field ``…_header: k`` (or
#   ``Some(k)``) set to a header constant.
_RUST_HEADER_READS = (
    re.compile(
        r"\bheaders(?:\(\))?\s*\.\s*(?:get|get_all|contains_key)\(\s*&?(" + _RUST_KEY + r")\s*\)"
    ),
    re.compile(r"\b[a-z_]\w*\(\s*&?headers\s*,\s*&?(" + _RUST_KEY + r")\s*[,)]"),
    re.compile(r"\b\w*_header\s*:\s*(?:Some\(\s*)?(" + _RUST_KEY + r")\s*\)?\s*[,}]"),
)
# The http crate's ``header::CONTENT_TYPE`` constants are the standard names, lower-kebab.
_RUST_HTTP_HEADER = re.compile(r"(?:http::)?header::([A-Z][A-Z0-9_]*)")
# A test module: everything from ``#[cfg(test)]`` before a ``mod`` is test code.
_RUST_TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\b")
# An axum handler's body: the extractor ``Json(request): Json<T>`` names its type.
_RUST_EXTRACTOR = re.compile(r"\bJson\(\s*(?:mut\s+)?\w+\s*\)\s*:\s*Json<\s*([\w:]+)\s*>")
_RUST_STRUCT = re.compile(r"\bstruct\s+([A-Za-z_]\w*)\s*(?:<[^{;()]*>)?\s*(?:where[^{;]*)?\{")
_RUST_ENUM = re.compile(r"\benum\s+([A-Za-z_]\w*)\s*(?:<[^{;()]*>)?\s*\{")
_RUST_VARIANT = re.compile(r"([A-Za-z_]\w*)\s*(?:(\()|(\{)|=[^,]*)?")
_RUST_ATTR_SERDE = re.compile(r"#\[serde\((.*?)\)\]\s*$", re.S)
_RUST_RENAME_ALL = re.compile(r'rename_all\s*=\s*"([^"]+)"')


def _rust_texts(texts: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for path, raw in texts.items():
        if not path.endswith(".rs") or re.search(r"(^|/)(tests|benches|examples)/", path):
            continue
        text = blank_comments(raw)
        if m := _RUST_TEST_MODULE.search(text):
            text = text[: m.start()]
        out[path] = text
    return out


def rust_headers(texts: Mapping[str, str]) -> Evidence:
    consts: dict[str, str] = {}
    for text in texts.values():
        for m in _RUST_CONST.finditer(text):
            consts.setdefault(m.group(1), m.group(2))
    found: Evidence = {}
    for path in sorted(texts):
        text = texts[path]
        for m in (m for p in _RUST_HEADER_READS for m in p.finditer(text)):
            key = m.group(1)
            if key.startswith('"'):
                value: str | None = key[1:-1]
            elif h := _RUST_HTTP_HEADER.fullmatch(key):
                value = h.group(1).lower().replace("_", "-")
            else:
                value = consts.get(key.rsplit("::", 1)[-1])
            if value and _HEADER_NAME.fullmatch(value):
                _add(found, value.lower(), path, text, m.start())
    return found


@dataclass(frozen=True)
class _RustField:
    names: tuple[str, ...]  # the JSON name, then its aliases; none: the value itself
    type_expr: str
    flatten: bool


@dataclass(frozen=True)
class _RustStruct:
    path: str
    fields: tuple[_RustField, ...]


def _rust_structs(texts: Mapping[str, str]) -> tuple[dict[str, list[_RustStruct]], set[str]]:
    """Every struct, and every enum with data, as its serde members; and the names of
    the enums without data (their values are strings, not members)."""
    structs: dict[str, list[_RustStruct]] = defaultdict(list)
    enums: set[str] = set()
    for path in sorted(texts):
        text = texts[path]
        for m in _RUST_STRUCT.finditer(text):
            start, end = _block(text, m.end() - 1)
            serde = _rust_serde(_rust_attributes_before(text, m.start()))
            rename_all = r.group(1) if (r := _RUST_RENAME_ALL.search(serde)) else ""
            fields = tuple(_rust_fields(text[start:end], rename_all))
            structs[m.group(1)].append(_RustStruct(path, fields))
        for m in _RUST_ENUM.finditer(text):
            start, end = _block(text, m.end() - 1)
            serde = _rust_serde(_rust_attributes_before(text, m.start()))
            fields = tuple(_rust_variants(text[start:end], serde))
            if fields:
                structs[m.group(1)].append(_RustStruct(path, fields))
            else:
                enums.add(m.group(1))
    return structs, enums


def _rust_serde(attributes: str) -> str:
    """The arguments of every ``#[serde(...)]`` in ``attributes``, joined."""
    return " ".join(
        a[len("#[serde(") : -2] for a in re.findall(r"#\[serde\(.*?\)\]", attributes, re.S)
    )


def _rust_variants(body: str, serde: str) -> Iterator[_RustField]:
    """An enum's members, by its serde representation: untagged or internally tagged
    (``tag = "type"``), a newtype variant's type is the enum's value itself, a
    struct variant's fields are that level's, and the tag is a member; externally
    tagged (the default), each variant with data is a member named by the variant.
    An enum whose variants hold no data has no members."""
    tag = t.group(1) if (t := re.search(r'\btag\s*=\s*"([^"]+)"', serde)) else None
    inline = tag is not None or re.search(r"\buntagged\b", serde) is not None
    rename_all = r.group(1) if (r := _RUST_RENAME_ALL.search(serde)) else ""
    members: list[_RustField] = []
    attrs, i = "", 0
    while i < len(body):
        if body[i] in " \t\n,":
            i += 1
        elif body.startswith("#[", i):
            end = _attribute_end(body, i)
            attrs, i = attrs + body[i:end], end
        elif m := _RUST_VARIANT.match(body, i):
            rename = re.search(r'\brename\s*=\s*"([^"]+)"', _rust_serde(attrs))
            name = rename.group(1) if rename else _rename_variant(m.group(1), rename_all)
            attrs, i = "", m.end()
            if m.group(2):  # Variant(Type): one type is a newtype, more a tuple
                close = _closing(body, m.end() - 1)
                type_expr, i = body[m.end() : close].strip(), close + 1
                if _type_end(type_expr, 0) == len(type_expr):
                    members.append(_RustField(() if inline else (name,), type_expr, flatten=False))
            elif m.group(3):  # Variant { fields }
                start, end = _block(body, m.end() - 1)
                i = end + 1
                if inline:
                    members += _rust_fields(body[start:end], "")
                else:
                    members.append(_RustField((name,), "", flatten=False))
        else:
            i += 1
    if members and tag:
        members.append(_RustField((tag,), "String", flatten=False))
    return iter(members)


def _closing(text: str, open_at: int) -> int:
    """The offset of the bracket that closes the one at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] in "(<[{":
            depth += 1
        elif text[i] in ")>]}" and not (text[i] == ">" and text[i - 1] == "-"):
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _rename_variant(name: str, rule: str) -> str:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    match rule:
        case "snake_case":
            return snake
        case "lowercase":
            return name.lower()
        case "UPPERCASE":
            return name.upper()
        case "kebab-case":
            return snake.replace("_", "-")
        case "camelCase":
            return name[:1].lower() + name[1:]
        case "SCREAMING_SNAKE_CASE":
            return snake.upper()
        case _:
            return name


def _rust_attributes_before(text: str, at: int) -> str:
    """The attributes of the declaration at ``at``: the text since the end of the item
    before it (``}`` or ``;``) or the start of the enclosing block (``{``)."""
    return text[max(text.rfind(c, 0, at) for c in "{};") + 1 : at]


def _rust_fields(body: str, rename_all: str) -> Iterator[_RustField]:
    """The serde view of each named field: ``rename``/``alias``/``flatten``/``skip``
    from its ``#[serde(...)]`` attributes, the container's ``rename_all`` applied."""
    attrs: list[str] = []
    i = 0
    while i < len(body):
        rest = body[i:]
        stripped = rest.lstrip()
        i += len(rest) - len(stripped)
        if not stripped:
            break
        if stripped.startswith("#["):
            end = _attribute_end(body, i)
            attrs.append(body[i:end])
            i = end
            continue
        m = re.match(r"(?:pub(?:\([^)]*\))?\s+)?([A-Za-z_]\w*)\s*:\s*", stripped)
        if not m:
            i += 1
            continue
        type_start = i + m.end()
        type_end = _type_end(body, type_start)
        serde = " ".join(s.group(1) for a in attrs if (s := _RUST_ATTR_SERDE.search(a)))
        attrs = []
        i = type_end + 1
        if re.search(r"\bskip\b|\bskip_deserializing\b", serde):
            continue
        rename = re.search(r'\brename\s*=\s*"([^"]+)"', serde)
        name = rename.group(1) if rename else _rename(m.group(1), rename_all)
        aliases = tuple(re.findall(r'\balias\s*=\s*"([^"]+)"', serde))
        yield _RustField(
            (name, *aliases),
            body[type_start:type_end].strip(),
            bool(re.search(r"\bflatten\b", serde)),
        )


def _attribute_end(text: str, start: int) -> int:
    """The end of the ``#[...]`` attribute at ``start``."""
    depth = 0
    for m in _C_BRACKETS.finditer(text, start):
        if m.group() in ("[", "]"):
            depth += 1 if m.group() == "[" else -1
            if depth == 0:
                return m.end()
    return len(text)


def _type_end(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c in "<([":
            depth += 1
        elif c in ">)]" and not (c == ">" and text[i - 1] == "-"):
            depth -= 1
        elif c == "," and depth == 0:
            return i
    return len(text)


def _rename(name: str, rule: str) -> str:
    words = name.split("_")
    match rule:
        case "camelCase":
            return words[0] + "".join(w.capitalize() for w in words[1:])
        case "PascalCase":
            return "".join(w.capitalize() for w in words)
        case "kebab-case":
            return "-".join(words)
        case "SCREAMING_SNAKE_CASE" | "UPPERCASE":
            return name.upper()
        case _:
            return name


_RUST_WRAPPERS = ("Option", "Box", "Arc", "Rc")
_RUST_COLLECTIONS = ("Vec", "VecDeque", "HashSet", "BTreeSet", "HashMap", "BTreeMap", "IndexMap")


def rust_serde_reads(texts: Mapping[str, str], handlers: str) -> Evidence:
    """Body paths of the request types the HTTP handlers under ``handlers`` extract
    (each a request's top level), through every struct their fields refer to."""
    structs, enums = _rust_structs(texts)
    walk = _RustWalk(structs, enums, {})
    for path in sorted(texts):
        if not path.startswith(handlers.rstrip("/") + "/"):
            continue
        extracted = {m.group(1).rsplit("::", 1)[-1] for m in _RUST_EXTRACTOR.finditer(texts[path])}
        for name in sorted(extracted):
            if (root := _rust_nearest(structs, name, path)) is not None:
                walk.struct(root, "", frozenset({(root.path, name)}))
    return walk.found


@dataclass
class _RustWalk:
    """The serde members reachable from root structs, into ``found``."""

    structs: Mapping[str, list[_RustStruct]]
    enums: set[str]
    found: Evidence

    def struct(self, struct: _RustStruct, prefix: str, seen: frozenset[tuple[str, str]]) -> None:
        for f in struct.fields:
            steps, name = _rust_type(f.type_expr)
            target = None if name in self.enums else _rust_nearest(self.structs, name, struct.path)
            if target and (target.path, name) in seen:
                target = None
            inner = seen | {(target.path, name)} if target else seen
            if f.flatten:
                # A flattened struct's members are this level's; a flattened map or a
                # type from outside the tree (the upstream OpenAI request) adds none.
                if target and not steps:
                    self.struct(target, prefix, inner)
                continue
            if not f.names and target:  # an untagged or tagged enum's variant
                self.struct(target, _steps(prefix, steps), inner)
            for json_name in f.names:
                path = _join(prefix, json_name)
                self.found.setdefault(path, set()).add(struct.path)
                if target:
                    self.struct(target, _steps(path, steps), inner)


def _rust_type(type_expr: str) -> tuple[str, str]:
    """(``*`` per collection level, the innermost type's last path segment)."""
    steps = ""
    expr = type_expr.strip().lstrip("&")
    while m := re.fullmatch(r"(?:[\w]+::)*([A-Za-z_]\w*)\s*<(.*)>", expr, re.S):
        outer, inner = m.group(1), m.group(2)
        if outer in _RUST_WRAPPERS:
            expr = inner
        elif outer in _RUST_COLLECTIONS:
            steps += "*"
            expr = _last_type_argument(inner)
        else:
            break
    return steps, re.sub(r"<.*", "", expr, flags=re.S).rsplit("::", 1)[-1].strip()


def _last_type_argument(arguments: str) -> str:
    depth = 0
    for i in range(len(arguments) - 1, -1, -1):
        c = arguments[i]
        if c == ">":
            depth += 1
        elif c == "<":
            depth -= 1
        elif c == "," and depth == 0:
            return arguments[i + 1 :].strip()
    return arguments.strip()


def _rust_nearest(
    structs: Mapping[str, list[_RustStruct]], name: str, path: str
) -> _RustStruct | None:
    """The definition of ``name`` nearest to the file ``path`` by module nesting: the
    same file, then the file's own module directory (``x.rs`` -> ``x/``), then each
    enclosing directory up to the crate (at one level, only a single definition counts);
    else the only definition there is."""
    candidates = structs.get(name, [])
    if not candidates:
        return None
    for c in candidates:
        if c.path == path:
            return c
    file = PurePosixPath(path)
    own = file.parent if file.name in ("mod.rs", "lib.rs", "main.rs") else file.with_suffix("")
    for directory in (own, *own.parents):
        at_level = [c for c in candidates if PurePosixPath(c.path).parent == directory]
        if len(at_level) == 1:
            return at_level[0]
        if at_level:
            return None
    return candidates[0] if len(candidates) == 1 else None


# --- Python ------------------------------------------------------------------------------

# Module-level string constants: ``NAME = "value"`` (optionally annotated).
_PY_CONST = re.compile(
    r'^([A-Z_][A-Z0-9_]*)\s*(?::\s*[\w\[\], .]+)?=\s*[bf]?(["\'])([^"\'\n]*)\2\s*$', re.M
)
_PY_KEY = r'[bf]?"[^"\n]*"|[bf]?\'[^\'\n]*\'|[A-Za-z_][\w.]*'
# Where Python code reads a request header: ``headers.get(k)`` / ``headers[k]`` (read),
# and, in a loop over raw ASGI headers ``for name, value in ...headers...``, a
# comparison of ``name`` (``.decode()``/``.lower()`` allowed) with a header name.
_PY_HEADER_READS = (
    re.compile(r"\bheaders\s*\.\s*get\(\s*(" + _PY_KEY + r")"),
    re.compile(r"\bheaders\s*\[\s*(" + _PY_KEY + r")\s*\](?!\s*=[^=])"),
)
_PY_HEADER_LOOP = re.compile(r"\bfor\s+(\w+)\s*,\s*\w+\s+in\s+[^\n:]*headers\b")
# Body reads: ``getattr(request, "member")`` / ``hasattr`` on one of the plan's request
# variables; ``body.member`` (read, not called or assigned) on one of its parsed-body
# variables; ``<...>kv_transfer_params.get(k)`` / ``[k]`` (a key of the parameters).
_PY_GETATTR = re.compile(r"\b(?:get|has)attr\(\s*(\w+)\s*,\s*[\"'](\w+)[\"']")
_PY_ATTRIBUTE = re.compile(r"(?<![\w.])(\w+)\.([A-Za-z_]\w*)\b(?!\s*\()(?!\s*=[^=])")
_PY_KV_KEY = re.compile(
    r"\b\w*kv_transfer_params\s*(?:\.\s*get\(\s*|\[\s*)(" + _PY_KEY + r")\s*(\]\s*=(?!=))?"
)


def _python_texts(texts: Mapping[str, str]) -> dict[str, str]:
    return {
        path: blank_comments(text, python=True)
        for path, text in texts.items()
        if path.endswith(".py")
        and not re.search(r"(^|/)tests?/", path)
        and not PurePosixPath(path).name.startswith(("test_", "conftest"))
    }


def _py_resolve(key: str, consts: Mapping[str, str]) -> str | None:
    if key[:1] in "\"'bf" and key[-1:] in "\"'":
        return _unquote(key)
    return consts.get(key.rsplit(".", 1)[-1])


def _py_consts(texts: Mapping[str, str]) -> dict[str, str]:
    consts: dict[str, str] = {}
    for text in texts.values():
        for m in _PY_CONST.finditer(text):
            consts.setdefault(m.group(1), m.group(3))
    return consts


def python_headers(texts: Mapping[str, str]) -> Evidence:
    consts = _py_consts(texts)
    found: Evidence = {}
    for path in sorted(texts):
        text = texts[path]
        matches = [m for p in _PY_HEADER_READS for m in p.finditer(text)]
        for name in {m.group(1) for m in _PY_HEADER_LOOP.finditer(text)}:
            compare = (
                re.escape(name) + r"(?:\.decode\(\))?(?:\.lower\(\))?\s*==\s*(" + _PY_KEY + ")"
            )
            matches += list(re.finditer(r"\b" + compare, text))
        for m in matches:
            value = _py_resolve(m.group(1), consts)
            if value and _HEADER_NAME.fullmatch(value):
                _add(found, value.lower(), path, text, m.start())
    return found


def python_body_reads(
    texts: Mapping[str, str], request_names: Sequence[str], body_names: Sequence[str]
) -> Evidence:
    consts = _py_consts(texts)
    found: Evidence = {}
    for path in sorted(texts):
        text = texts[path]
        for m in _PY_GETATTR.finditer(text):
            if m.group(1) in request_names:
                _add(found, m.group(2), path, text, m.start())
        for m in _PY_ATTRIBUTE.finditer(text):
            if m.group(1) in body_names:
                _add(found, m.group(2), path, text, m.start())
        for m in _PY_KV_KEY.finditer(text):
            key = _py_resolve(m.group(1), consts)
            if m.group(2) is None and key and _JSON_KEY.fullmatch(key):
                _add(found, "kv_transfer_params." + key, path, text, m.start())
    return found


# --- reading plans -----------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which parts of a component's repository are read, and how."""

    name: str
    repository: str  # OWNER/REPO on GitHub
    language: str  # "go" | "rust" | "python"
    # The files read (directories or files). For Go, where header and map reads count;
    # its constants and types are resolved across every package of the repository.
    dirs: tuple[str, ...]
    go_roots: tuple[GoRoot, ...] = ()
    go_maps: tuple[GoMapReads, ...] = ()
    rust_handlers: str = ""  # the directory of the HTTP handlers
    python_request_names: tuple[str, ...] = ()  # getattr/hasattr on these
    python_body_names: tuple[str, ...] = ()  # attributes of these


_EPP_TYPES: Final = "pkg/epp/framework/interface/requesthandling"

PLANS: Final[Mapping[str, Plan]] = {
    plan.name: plan
    for plan in (
        # The endpoint picker (pkg/epp, cmd/epp) and the coordinator (pkg/coordinator,
        # cmd/coordinator), with the code they share (pkg/common). The picker decodes a
        # body into one member of InferenceRequestBody per API; both also read keys of
        # the decoded map (the picker's parsers ``bodyMap``, its tokenizer ``payload``
        # and ``pm``; the coordinator's ``reqCtx.Body``, a leg's copy ``body``, the
        # handler's ``parsed``).
        Plan(
            name="llm-d-router",
            repository="llm-d/llm-d-router",
            language="go",
            dirs=("pkg/epp", "pkg/coordinator", "pkg/common", "cmd/epp", "cmd/coordinator"),
            go_roots=(GoRoot(_EPP_TYPES, "InferenceRequestBody", envelope=True),),
            go_maps=(
                GoMapReads(
                    (
                        "pkg/epp/framework/plugins/requesthandling",
                        "pkg/epp/framework/plugins/requestcontrol",
                    ),
                    ("bodyMap", "payload", "pm"),
                    ("MaxOutputTokensFromPayload",),
                ),
                GoMapReads(("pkg/coordinator",), ("reqCtx.Body", "body", "parsed")),
            ),
        ),
        # The routing sidecar in the decode pod (pkg/sidecar, cmd/pd-sidecar): the
        # client's body is ``completionRequest`` (``requestData``, ``req`` in helpers).
        Plan(
            name="llm-d-sidecar",
            repository="llm-d/llm-d-router",
            language="go",
            dirs=("pkg/sidecar", "cmd/pd-sidecar"),
            go_maps=(GoMapReads(("pkg/sidecar",), ("completionRequest", "requestData", "req")),),
        ),
        # Dynamo's Rust frontend (lib/llm) and its request types (lib/protocols, its
        # own copy of the OpenAI and Anthropic types); the bodies are what the HTTP
        # service's handlers extract as ``Json<T>``.
        Plan(
            name="dynamo",
            repository="ai-dynamo/dynamo",
            language="rust",
            dirs=("lib/llm/src", "lib/protocols/src"),
            rust_handlers="lib/llm/src/http/service",
        ),
        # Ray Serve LLM (python/ray/llm/_internal/serve, python/ray/serve/llm) and the
        # Serve HTTP proxy every request passes (python/ray/serve/_private: the proxy,
        # its request wrapper, its HTTP helpers and constants). Its bodies are vLLM's
        # request models (the wheel inventory lists them); its handlers name the parsed
        # body ``body``, its servers the request model ``request``.
        Plan(
            name="ray-serve",
            repository="ray-project/ray",
            language="python",
            dirs=(
                "python/ray/llm/_internal/serve",
                "python/ray/serve/llm",
                "python/ray/serve/_private/proxy.py",
                "python/ray/serve/_private/proxy_request_response.py",
                "python/ray/serve/_private/http_util.py",
                "python/ray/serve/_private/constants.py",
            ),
            python_request_names=("request", "req", "prefill_request", "decode_request"),
            python_body_names=("body",),
        ),
    )
}


@dataclass(frozen=True)
class Reading:
    """What one component's sources read, with where each name was found."""

    plan: Plan
    commit: str
    headers: Evidence
    reads: Evidence

    @property
    def key(self) -> str:
        return f"{self.plan.name} {self.commit[:12]}"

    def source(self) -> dict[str, object]:
        """The component's source entry in the inventory format."""
        return {
            "engine": self.plan.name,
            "release": self.commit[:12],
            "origin": f"github:{self.plan.repository}@{self.commit}",
            "refresh": f"{GENERATED_BY} --tree {self.plan.name}=$GITDIR@{self.commit}",
            "endpoints": {},
            "models": {},
            "headers": sorted(self.headers),
            "part_types": [],
            "connector_keys": [],
            "reads": sorted(self.reads),
        }


def read_component(plan: Plan, tree: Tree) -> Reading:
    if plan.language == "go":
        paths = tree.paths(())
        texts = tree.read([p for p in paths if _is_go_source(p) or p == "go.mod"])
        source = GoSource.load(texts, texts.get("go.mod", ""))
        headers = go_headers(source, plan.dirs)
        reads = go_struct_reads(source, plan.go_roots)
        for maps in plan.go_maps:
            for name, where in go_map_reads(source, maps).items():
                reads.setdefault(name, set()).update(where)
    elif plan.language == "rust":
        texts = _rust_texts(tree.read(tree.paths(plan.dirs)))
        headers = rust_headers(texts)
        reads = rust_serde_reads(texts, plan.rust_handlers)
    else:
        texts = _python_texts(tree.read(tree.paths(plan.dirs)))
        headers = python_headers(texts)
        reads = python_body_reads(texts, plan.python_request_names, plan.python_body_names)
    return Reading(plan, tree.commit, headers, reads)


# --- the snapshot file and the command line ---------------------------------------------


def merge(previous: Mapping[str, object], readings: Iterable[Reading]) -> dict[str, object]:
    """``previous`` with each reading's component replaced by the reading."""
    old = previous.get("sources", {})
    sources = dict(old) if isinstance(old, dict) else {}
    for reading in readings:
        sources = {k: v for k, v in sources.items() if not _of_component(v, reading.plan.name)}
        sources[reading.key] = reading.source()
    return {"generated_by": GENERATED_BY, "sources": sources}


def _of_component(source: object, name: str) -> bool:
    return isinstance(source, dict) and source.get("engine") == name


def dumps(document: Mapping[str, object]) -> str:
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def _parse_tree(spec: str) -> tuple[Plan, Path, str]:
    name, sep, location = spec.partition("=")
    if not sep or name not in PLANS:
        raise StacksError(f"--tree {spec!r}: NAME must be one of {', '.join(PLANS)}")
    gitdir, at, rev = location.rpartition("@")
    if not at or "/" in rev:
        gitdir, rev = location, "HEAD"
    return PLANS[name], Path(gitdir), rev


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=GENERATED_BY, description="Read the stacks' sources into stacks.json."
    )
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=GITDIR[@REV]")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--explain", action="store_true", help="print where each name was found")
    args = parser.parse_args(argv)
    try:
        readings = [
            read_component(plan, Tree.open(gitdir, rev))
            for plan, gitdir, rev in map(_parse_tree, args.tree)
        ]
    except (StacksError, subprocess.CalledProcessError) as error:
        print(f"stacks: {error}", file=sys.stderr)
        return 2
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.write_text(dumps(merge(previous, readings)))
    for reading in readings:
        print(f"{reading.key}: {len(reading.headers)} headers, {len(reading.reads)} body paths")
        if args.explain:
            for kind, evidence in (("header", reading.headers), ("read", reading.reads)):
                for name in sorted(evidence):
                    print(f"  {kind} {name}: {', '.join(sorted(evidence[name])[:3])}")
    return 0
