"""A route's metadata under a name one slip from the processor's namespace: the processor
reads only its own namespace, so a route whose policy sits under ``ext_proc.token_polcy``
(or ``Ext_Proc.Token_Policy``, ``ext-proc.token-policy``) is run as if it had none
(aggregated + strip): a mint route signs nothing, every decode recomputes, clients see
200 and nothing says why. Such a name is an error wherever it is, beside the right one
too (the fields the operator meant are not read). A misspelt field inside the namespace
is the policy's own error (``policy-invalid``: the processor's validation names an
unknown field)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import Route

# Characters an operator may type for one another in a dotted name.
_SEPARATORS: Final = str.maketrans("", "", "._-/ ")
# Below this length an edit is as likely another name as a slip: only case and
# separators are folded.
_SHORTEST_EDITED: Final = 8


def near_misses(route: Route, namespace: str) -> Iterator[Finding]:
    """An error for each of the route's ``filter_metadata`` names that is a slip of
    ``namespace`` (``near``)."""
    metadata = route.entry.get("metadata")
    given = metadata.get("filter_metadata") if isinstance(metadata, dict) else None
    if not isinstance(given, dict):
        return
    for name in given:
        if isinstance(name, str) and name != namespace and near(name, namespace):
            read = "its policy" if namespace in given else "no policy (aggregated + strip)"
            yield error(
                "policy-namespace-misspelt",
                route.place,
                f"filter_metadata {name!r} is one slip from the processor's namespace "
                f"{namespace!r}, which is the only one it reads: the route runs with {read}. "
                "Rename it",
            )


def near(name: str, namespace: str) -> bool:
    """Whether ``name`` is ``namespace`` with its case or separators changed, or (for a
    namespace of 8 characters or more) within two edits of it (a character typed,
    dropped, replaced or two swapped: ``distance``)."""
    a, b = name.lower(), namespace.lower()
    if a.translate(_SEPARATORS) == b.translate(_SEPARATORS):
        return True
    return len(b) >= _SHORTEST_EDITED and distance(a, b) <= 2


def distance(a: str, b: str) -> int:
    """The optimal string alignment distance: insertions, deletions, substitutions and
    swaps of two neighbours, each one edit."""
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        earlier, before, row = before, row, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(before[j] + 1, row[j - 1] + 1, before[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], earlier[j - 2] + 1)
    return row[len(b)]
