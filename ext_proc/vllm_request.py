"""What vLLM does with a request document: the keys it reuses and when it ignores them.

Pure queries on the document ``body.parse`` returned; no parsing, no decisions. The
facts come from vLLM's online renderer (``_reused_prompt_token_ids``): it pops the
policed keys from ``kv_transfer_params`` whenever they are there, and renders the
messages instead when the request echoes or carries non-text content.
"""

from __future__ import annotations

from typing import Any, Final

KV_KEY: Final = "kv_transfer_params"
IDS_KEY: Final = "prompt_token_ids"
# Keys vLLM's reuse helper reads from kv_transfer_params; both are policed alike.
POLICED_KEYS: Final = (IDS_KEY, "prompt_features")
# Content part types that carry text only; anything else makes vLLM ignore reused ids.
TEXT_PART_TYPES: Final = frozenset({"text", "input_text", "output_text"})
# Input items (chat messages, responses input) that are text when their content is.
_TEXT_ITEM_TYPES: Final = TEXT_PART_TYPES | {"message"}


def policed_keys(params: dict[str, Any]) -> tuple[str, ...]:
    """The policed keys present in a ``kv_transfer_params`` object, in policy order."""
    if not params:
        return ()
    return tuple(key for key in POLICED_KEYS if key in params)


def _text_only(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    if isinstance(content, list):
        return all(
            isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES for part in content
        )
    return False


def ignores_reused_ids(document: dict[str, Any]) -> bool:
    """True when vLLM would render the messages instead of using reused ids.

    vLLM ignores them when ``echo`` is set or the input carries non-text content. This
    errs towards True: a false True only strips ids vLLM might have used.
    """
    if document.get("echo") not in (None, False):
        return True
    if not _text_only(document.get("system")):
        return True
    for key in ("messages", "input"):
        items = document.get(key)
        if items is None or isinstance(items, str):
            continue
        if not isinstance(items, list):
            return True
        for item in items:
            if not isinstance(item, dict) or not _text_only(item.get("content")):
                return True
            if item.get("type", "message") not in _TEXT_ITEM_TYPES:
                return True
    return False
