"""Tenants against a real vLLM: the same long prompt sent by two tenants through the
gateway (Envoy's jwt_authn names the tenant, the processor writes its cache_salt) never
hits the other tenant's prefix cache, while a tenant's repeated prompt does. The oracle
is vLLM's own counters: ``vllm:prefix_cache_hits_total`` and
``vllm:prefix_cache_queries_total`` (tokens), and ``vllm:cache_config_info`` for the
block size and that prefix caching is on."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from ext_proc.core.address import HostPort
from tests.e2e.stack import Stack, route
from tests.e2e.test_tenants import PREFIX, TENANT_HEADER, TENANT_KEY, edit, token

_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$")


def metrics(base_url: str) -> tuple[dict[str, float], str]:
    """Each vLLM counter summed over its labels, and the text itself."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    sums: dict[str, float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found:
            sums[found.group(1)] = sums.get(found.group(1), 0.0) + float(found.group(3))
    return sums, text


def block_size(text: str) -> int:
    (info,) = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert 'enable_prefix_caching="True"' in info, info
    found = re.search(r'block_size="([0-9]+)"', info)
    assert found is not None, info
    return int(found.group(1))


def long_prompt(vllm: str, nonce: str, tokens: int) -> str:
    """``nonce`` and words, at least ``tokens`` long as vLLM's own /tokenize counts."""
    words = [nonce]
    while True:
        prompt = " ".join(words)
        counted = httpx.post(
            f"{vllm}/tokenize", json={"model": "tiny", "prompt": prompt}, timeout=30
        ).json()["count"]
        if counted >= tokens:
            return prompt
        words += [f"w{(len(words) + i) % 97}" for i in range(16)]


@pytest.fixture(scope="module")
def tenanted(vllm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("vllm-tenants")
    key_file = workdir / "tenant.key"
    key_file.write_bytes(TENANT_KEY)
    stack = Stack(
        workdir,
        routes=[route("tenant", PREFIX, {"action": "strip", "tenant": f"header:{TENANT_HEADER}"})],
        real_upstream=HostPort.parse(vllm.removeprefix("http://")),
        processor_config={"tenants": {"key_file": str(key_file)}},
        edit=edit,
    )
    with stack as running:
        yield running


# Each API a tenant route serves that runs a prompt, with its body and where its answer
# counts the prompt's tokens.
APIS = {
    "chat/completions": (
        lambda prompt: {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1},
        lambda usage: usage["prompt_tokens"],
    ),
    "completions": (
        lambda prompt: {"prompt": prompt, "max_tokens": 1},
        lambda usage: usage["prompt_tokens"],
    ),
    "responses": (
        lambda prompt: {"input": prompt, "max_output_tokens": 1},
        lambda usage: usage["input_tokens"],
    ),
}


def send(stack: Stack, tenant: str, prompt: str, api: str = "chat/completions") -> int:
    """The prompt's token count, once its request is served."""
    body, counted = APIS[api]
    answer = httpx.post(
        f"{stack.url}{PREFIX}{api}",
        json={"model": "tiny", "temperature": 0, **body(prompt)},
        headers={"authorization": f"Bearer {token(tenant)}"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    count: int = counted(answer.json()["usage"])
    return count


@pytest.mark.parametrize("api", list(APIS))
def test_tenants_never_share_a_prefix_cache_hit(vllm: str, tenanted: Stack, api: str) -> None:
    counters, text = metrics(vllm)
    size = block_size(text)
    # A prompt new to this server (the nonce first), longer than a few blocks and
    # within the model's context (1024 tokens).
    prompt = long_prompt(vllm, uuid.uuid4().hex, min(4 * size, 960))
    blocks = 0

    def hits(tenant: str) -> float:
        before = counters["vllm:prefix_cache_hits_total"]
        counted = counters["vllm:prefix_cache_queries_total"]
        nonlocal blocks
        tokens = send(tenanted, tenant, prompt, api)
        blocks = tokens // size
        assert blocks >= 3, (tokens, size)
        deadline = time.monotonic() + 20
        while True:
            now, _ = metrics(vllm)
            if now["vllm:prefix_cache_queries_total"] - counted >= tokens:
                break
            assert time.monotonic() < deadline, "vLLM did not count the request's query"
            time.sleep(0.2)
        counters.update(now)
        return now["vllm:prefix_cache_hits_total"] - before

    # Full blocks are cached; the last one may be recomputed.
    assert hits("team-a") == 0  # new to the server
    assert hits("team-a") >= (blocks - 1) * size  # its own prefix, cached
    assert hits("team-b") == 0  # the same prompt, another tenant: nothing shared
    assert hits("team-b") >= (blocks - 1) * size  # team b's own, cached


def test_without_a_tenant_source_any_client_hits_anothers_prefix(
    vllm: str, tenanted: Stack
) -> None:
    # The control arm: the shipped route names no tenant source, so a client's prompt
    # hits the prefix another client cached (whatever tenant each one is).
    counters, text = metrics(vllm)
    size = block_size(text)
    prompt = long_prompt(vllm, uuid.uuid4().hex, min(4 * size, 960))
    body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    for _ in range(2):
        answer = httpx.post(f"{tenanted.url}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
    tokens = answer.json()["usage"]["prompt_tokens"]
    deadline = time.monotonic() + 20
    while True:
        now, _ = metrics(vllm)
        queried = (
            now["vllm:prefix_cache_queries_total"] - counters["vllm:prefix_cache_queries_total"]
        )
        if queried >= 2 * tokens:
            break
        assert time.monotonic() < deadline, "vLLM did not count the requests' queries"
        time.sleep(0.2)
    hits = now["vllm:prefix_cache_hits_total"] - counters["vllm:prefix_cache_hits_total"]
    assert hits >= (tokens // size - 1) * size
