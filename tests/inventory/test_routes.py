"""routes: every route, with a body or without, however it is declared (decorators,
api_route methods, add_api_route, a factory function, an environment-overridable path, a
prefixed router), and its root: the handler's model, a union alias, a model built from
the body, or none."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.inventory.routes import Root, routes
from devstack.inventory.schema import Schema
from tests.inventory.wheelfiles import package

PROTOCOL = """
    from pydantic import BaseModel

    class Chat(BaseModel):
        messages: list[str]

    class Tokenize(BaseModel):
        prompt: str

    class TokenizeChat(BaseModel):
        messages: list[str]

    TokenizeRequest = Tokenize | TokenizeChat

    class Scoring(BaseModel):
        query: str
"""
ROUTER = """
    import os
    from typing import Annotated

    from fastapi import APIRouter, Body, FastAPI, Form, Request

    from app.protocol import Chat, TokenizeRequest

    router = APIRouter()
    admin = APIRouter(prefix="/admin")

    @router.post("/v1/chat/completions")
    async def chat(request: Chat, raw_request: Request): ...

    @router.api_route("/generate", methods=["POST", "PUT"])
    async def generate(raw_request: Request, obj: Annotated[Chat, Body()]): ...

    @router.api_route("/flush", methods=["GET", "POST"])
    async def flush(): ...

    @router.get("/models")
    async def models(raw_request: Request): ...

    @router.get("/session")
    async def session(obj: Chat): ...

    @router.head("/")
    @router.get("/")
    async def root(): ...

    @router.post(os.environ.get("CHAT_ROUTE", "/api/chat"))
    async def env_chat(request: Chat): ...

    @router.post("/tokenize")
    async def tokenize(request: TokenizeRequest, raw_request: Request): ...

    @router.post("/form")
    async def form(request: Annotated[Chat, Form()]): ...

    @admin.post("/reset")
    async def reset(): ...

    async def abort(raw_request: Request): ...

    router.add_api_route("/abort", abort, methods=["POST"])

    def attach(app: FastAPI, enabled: bool) -> None:
        @router.post("/inner")
        async def inner(request: Chat): ...

        for route in router.routes:
            app.add_api_route(route.path, abort, methods=["POST"])

    @router.post("/score")
    async def score(raw_request: Request):
        from app.protocol import Scoring

        body = await raw_request.json()
        return Scoring(**body)

    @router.post("/invocations")
    async def invocations(raw_request: Request):
        return await raw_request.json()
"""


@pytest.fixture
def found(tmp_path: Path) -> dict[str, Root | None]:
    wheel = package(tmp_path, {"app/protocol.py": PROTOCOL, "app/api/router.py": ROUTER})
    return routes(wheel, Schema(wheel), ("app.api",))


def _roots(found: dict[str, Root | None]) -> dict[str, str | None]:
    return {endpoint: None if root is None else root.name for endpoint, root in found.items()}


def test_every_route_and_its_root(found: dict[str, Root | None]) -> None:
    assert _roots(found) == {
        "POST /v1/chat/completions": "Chat",
        "POST /generate": "Chat",
        "PUT /generate": "Chat",
        "GET /flush": None,  # GET and POST: each method is a route
        "POST /flush": None,
        "GET /models": None,  # no body: judged all the same
        "GET /session": "Chat",  # a GET whose handler declares a body model
        "GET /": None,  # two decorators, one method each
        "HEAD /": None,
        "POST /api/chat": "Chat",  # the default of an environment-overridable path
        "POST /tokenize": "TokenizeRequest",
        "POST /form": "Chat",
        "POST /admin/reset": None,
        "POST /abort": None,
        "POST /inner": "Chat",
        "POST /score": "Scoring",  # built from the body the handler reads itself
        "POST /invocations": None,
    }


def test_a_union_alias_root_names_its_members(found: dict[str, Root | None]) -> None:
    root = found["POST /tokenize"]
    assert root is not None
    assert root.alias is not None
    assert [cls.name for cls in root.members] == ["Tokenize", "TokenizeChat"]


def test_routes_outside_the_prefixes_are_not_read(tmp_path: Path) -> None:
    wheel = package(tmp_path, {"app/protocol.py": PROTOCOL, "app/api/router.py": ROUTER})
    assert routes(wheel, Schema(wheel), ("app.other",)) == {}
