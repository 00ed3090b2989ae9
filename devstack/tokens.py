"""The token ids the stand-in upstream reports, as vLLM 0.32 reports them.

A byte-level stand-in for a tokenizer: a prompt's ids are a BOS id followed by the
UTF-8 bytes of its rendered text, so they are deterministic, never empty and below any
test route's vocabulary. Like vLLM (``_reused_prompt_token_ids``), a request whose
``kv_transfer_params`` carry valid ``prompt_token_ids`` runs on those ids instead of its
rendered prompt, unless it sets ``echo`` or its messages carry non-text content; so the
reported ids and ``usage`` tell whether ids reached the upstream and were honored.
"""

from __future__ import annotations

from typing import Any

BOS = 256  # beyond every byte value, so a prompt's first id is recognisable
EOS = 257
GENERATED = [EOS]  # every reply generates one token, ending the sequence

# What a NIXL prefill server returns for a request with ``do_remote_decode: true``
# (``request_finished`` of vLLM's NIXL connector): where the decode server fetches the
# KV blocks from. The addresses are the stand-in's own and reach nothing.
CONNECTOR_REPLY: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2]],
    "remote_engine_id": "stub-engine",
    "remote_request_id": "stub-request",
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}


# What a NIXL decode server with ``bidirectional_kv_xfer`` returns for a decode request
# (``request_finished``, the decode side): where the next turn's prefill server reads
# the turn's KV back from. ``remote_num_tokens``: the tokens it computed, its prompt and
# its output but the last token (``turn_reply``).
TURN_REPLY: dict[str, Any] = {
    "do_remote_prefill": False,
    "do_remote_decode": True,
    "remote_block_ids": [[3, 4]],
    "remote_engine_id": "stub-decode-engine",
    "remote_request_id": "stub-decode-request",
    "remote_host": "127.0.0.1",
    "remote_port": 5601,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_blocks_expiry_time": 1000.0,
    "transfer_mode": "pull",
}


def _text(content: Any) -> tuple[str, bool]:
    """A message's text and whether it was text only (vLLM ignores reused ids otherwise)."""
    if isinstance(content, str):
        return content, True
    if not isinstance(content, list):
        return "", content is None
    texts, text_only = [], True
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
            texts.append(str(part.get("text", "")))
        else:
            text_only = False
    return "".join(texts), text_only


def _messages(messages: Any) -> tuple[str, bool]:
    rendered, text_only = [], True
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        text, only = _text(message.get("content"))
        rendered.append(f"<|{message.get('role', 'user')}|>{text}\n")
        text_only = text_only and only
    return "".join(rendered), text_only


def render(path: str, document: dict[str, Any]) -> tuple[str, bool]:
    """The prompt text a request renders to, and whether it is text only."""
    if path.endswith("/chat/completions") or path.endswith("/messages"):
        system, _ = _text(document.get("system"))
        text, text_only = _messages(document.get("messages"))
        return (f"<|system|>{system}\n" if system else "") + text, text_only
    if path.endswith("/responses"):
        instructions, _ = _text(document.get("instructions"))
        given = document.get("input")
        text, text_only = _text(given) if isinstance(given, str) else _messages(given)
        return (f"<|system|>{instructions}\n" if instructions else "") + text, text_only
    prompt = document.get("prompt")
    return (prompt if isinstance(prompt, str) else ""), True


def _reused(document: dict[str, Any], text_only: bool) -> list[int] | None:
    """The ids vLLM would run on instead of the rendered prompt, if any."""
    params = document.get("kv_transfer_params")
    if not isinstance(params, dict) or document.get("echo") or not text_only:
        return None
    ids = params.get("prompt_token_ids")
    if not isinstance(ids, list) or not ids:
        return None
    if not all(type(i) is int and i >= 0 for i in ids):
        return None
    return ids


def prompt_ids(path: str, document: dict[str, Any]) -> list[int]:
    """The ids the engine runs on for this request: reused ones, or the rendered prompt's."""
    text, text_only = render(path, document)
    reused = _reused(document, text_only)
    if reused is not None:
        return reused
    given = document.get("prompt")
    completions = path.endswith("/completions") and not path.endswith("/chat/completions")
    if completions and isinstance(given, list) and given and all(type(i) is int for i in given):
        return given  # a token-id prompt runs as given
    return [BOS, *text.encode()]


def transfer_params(
    document: dict[str, Any], computed: int = 0, *, bidirectional: bool = False
) -> dict[str, Any] | None:
    """The response's ``kv_transfer_params``: the connector's, for a prefill request
    (``do_remote_decode: true``); with ``bidirectional``, the decode server's turn
    parameters for a decode request (``do_remote_prefill: true``) that ``computed``
    tokens; else ``null`` as from a server without a connector."""
    params = document.get("kv_transfer_params")
    if isinstance(params, dict) and params.get("do_remote_decode") is True:
        return dict(CONNECTOR_REPLY)
    if bidirectional and isinstance(params, dict) and params.get("do_remote_prefill") is True:
        return {**TURN_REPLY, "remote_num_tokens": computed}
    return None
