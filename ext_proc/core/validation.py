"""One wording for pydantic validation errors, shared by every validated input."""

from __future__ import annotations

from pydantic import ValidationError


def problems(exc: ValidationError) -> str:
    """``field.path: message; ...`` for every error pydantic found."""
    return "; ".join(
        f"{'.'.join(str(part) for part in err['loc']) or '(root)'}: {err['msg']}"
        for err in exc.errors()
    )
