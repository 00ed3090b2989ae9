"""pysource: modules are named from a wheel's paths and parsed only when asked for; a name
resolves through relative, aliased, re-exported, starred and TYPE_CHECKING imports to
the wheel's class or assignment, or to another package's dotted name."""

from __future__ import annotations

import ast
from pathlib import Path

from devstack.inventory.pysource import Alias, Class, External, Package, constant
from tests.inventory.wheelfiles import package

FILES = {
    "app/__init__.py": "from .models import Chat as Chat\n",
    "app/models.py": """
        from typing import TYPE_CHECKING
        import pydantic as pd
        from .base import *
        if TYPE_CHECKING:
            from openai.types import Message
        else:
            Message = object
        class Chat(pd.BaseModel):
            pass
        Content = str | list[Message]
        NAME = "x-name"
    """,
    "app/base.py": "class Base:\n    pass\n",
    "app/api/routes.py": """
        from .. import Chat
        from ..models import Content as Body, NAME
        import app.models
        from app import models as m
    """,
    "app/broken.py": "def (:\n",  # not Python to any interpreter
    "app/data.py": "ignored = 1\n",
}


def _name(package: Package, module: str, text: str) -> object:
    found = package.module(module)
    assert found is not None
    return package.resolve(found, ast.parse(text, mode="eval").body)


def test_modules_are_named_from_their_paths(tmp_path: Path) -> None:
    found = package(tmp_path, FILES)
    assert sorted(found.texts) == [
        "app",
        "app.api.routes",
        "app.base",
        "app.broken",
        "app.data",
        "app.models",
    ]
    assert found.names("app.api") == ["app.api.routes"]
    assert found.names("app", containing="Chat") == ["app", "app.api.routes", "app.models"]
    assert found.texts["app"][1] is True


def test_a_name_resolves_through_the_wheels_imports(tmp_path: Path) -> None:
    found = package(tmp_path, FILES)
    chat = _name(found, "app.api.routes", "Chat")
    assert isinstance(chat, Class)
    assert chat.qualname == "app.models.Chat"
    body = _name(found, "app.api.routes", "Body")
    assert isinstance(body, Alias)
    assert (body.module, body.name) == ("app.models", "Content")
    assert _name(found, "app.api.routes", "app.models.Chat") == chat
    assert _name(found, "app.api.routes", "m.Chat") == chat
    base = _name(found, "app.models", "Base")  # through `from .base import *`
    assert isinstance(base, Class)
    assert base.module == "app.base"


def test_other_packages_names_are_external(tmp_path: Path) -> None:
    found = package(tmp_path, FILES)
    # The TYPE_CHECKING import, not the `else:` assignment.
    assert _name(found, "app.models", "Message") == External("openai.types.Message")
    assert _name(found, "app.models", "pd.BaseModel") == External("pydantic.BaseModel")
    assert _name(found, "app.models", "len") is None


def test_constants_resolve_through_imports(tmp_path: Path) -> None:
    found = package(tmp_path, FILES)
    routes = found.module("app.api.routes")
    assert routes is not None
    assert constant(found, routes, ast.Name("NAME")) == ["x-name"]
    assert constant(found, routes, ast.Constant(b"x-bytes")) == ["x-bytes"]
    assert constant(found, routes, ast.Constant(1)) == []


def test_a_module_this_python_cannot_parse_binds_nothing(tmp_path: Path) -> None:
    found = package(tmp_path, FILES)
    broken = found.module("app.broken")
    assert broken is not None
    assert broken.bindings == {}
    assert found.unreadable == ["app.broken"]
    assert found.module("app.missing") is None
