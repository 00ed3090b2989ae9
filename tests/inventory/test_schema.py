"""schema: which classes are models (through the wheel's own bases), their fields
(inherited, aliased, without class variables and private attributes) and what each
field's annotation refers to through Optional, Union, Annotated, lists, mappings,
forward references and aliases."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.inventory.pysource import Class, Package
from devstack.inventory.schema import Schema
from tests.inventory.wheelfiles import package

MODELS = """
    import dataclasses
    import enum
    from typing import Annotated, Any, ClassVar, Generic, Literal, Optional, TypeVar, Union

    import msgspec
    from openai.types.chat import ChatCompletionMessageParam as OpenAIMessage
    from openai.types.responses import EasyInputMessageParam
    from pydantic import BaseModel, Field, PrivateAttr
    from typing_extensions import Required, TypedDict

    T = TypeVar("T")
    B = TypeVar("B", bound="Options")

    class OpenAIBaseModel(BaseModel):
        model_config: ClassVar[dict[str, Any]] = {}

    class Color(str, enum.Enum):
        RED = "red"

    class Part(TypedDict, total=False):
        type: Required[Literal["text"]]
        text: str

    class Image(TypedDict, total=False):
        type: Literal["image_url"]
        url: str

    PartParam = Union[Part, Image, str]
    Json = Union[dict[str, "Json"], list["Json"], str]

    class Message(OpenAIBaseModel):
        role: str
        content: str | list[PartParam] | None = None
        reply: Optional["Message"] = None

    class Options(msgspec.Struct):
        seed: int = 0

    @dataclasses.dataclass
    class Hints:
        room: int
        spent: bool = dataclasses.field(default=False, init=False)

    class Plain:
        pass

    class Phased(EasyInputMessageParam, total=False):
        phase: str

    class Base(OpenAIBaseModel):
        model: str
        temperature: float = 0.5
        _secret: str = PrivateAttr(default="")
        LIMIT: ClassVar[int] = 3

    class Chat(Base):
        temperature: Annotated[float, Field(ge=0)] = 1.0
        messages: list[Message | OpenAIMessage]
        extra: dict[str, Any] | None = None
        xargs: dict[str, str | int | list[int]] | None = None
        by_name: dict[str, list[Options]] = {}
        nested: list[list[Hints]] = []
        color: Color = Color.RED
        schema_: dict[str, Any] | None = Field(default=None, alias="schema")
        tag: Literal["a", "b"] = "a"
        free: Any = None
        json_value: Json = ""
        plain: Plain | None = None
        phased: Phased | None = None
        generic: T | None = None
        bare: dict = {}
        forward: "list[Options]" = []
        bounded: list[B] = []
"""


@pytest.fixture
def schema(tmp_path: Path) -> Schema:
    return Schema(package(tmp_path, {"app/models.py": MODELS}))


def _class(package: Package, name: str) -> Class:
    found = package.find(f"app.models.{name}")
    assert isinstance(found, Class)
    return found


def _refs(schema: Schema, model: str) -> dict[str, list[str]]:
    """Each field's references as text: "list:Message" for a class of the wheel."""
    result = {}
    for name, (module, annotation) in schema.fields(_class(schema.package, model)).items():
        refs = schema.references(module, annotation)
        result[name] = sorted(
            r.steps + (r.target.name if isinstance(r.target, Class) else r.target) for r in refs
        )
    return result


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("OpenAIBaseModel", "pydantic"),
        ("Chat", "pydantic"),  # through the wheel's Base and OpenAIBaseModel
        ("Part", "typeddict"),
        ("Options", "struct"),
        ("Hints", "dataclass"),
        ("Color", "enum"),
        ("Phased", "extends"),
        ("Plain", None),
    ],
)
def test_a_model_is_known_by_its_bases(schema: Schema, name: str, kind: str | None) -> None:
    assert schema.kind(_class(schema.package, name)) == kind


def test_fields_are_inherited_aliased_and_public(schema: Schema) -> None:
    fields = _refs(schema, "Chat")
    assert list(fields)[:2] == ["model", "temperature"]  # the base's first
    assert "schema" in fields
    assert not {"schema_", "_secret", "LIMIT", "model_config"} & set(fields)
    assert list(_refs(schema, "Hints")) == ["room"]  # init=False is not set by a body


def test_references_through_the_typing_forms(schema: Schema) -> None:
    fields = _refs(schema, "Chat")
    assert fields["model"] == []
    assert fields["temperature"] == []  # Annotated
    assert fields["messages"] == [
        "list:Message",
        "list:ext:openai.types.chat.ChatCompletionMessageParam",
    ]
    assert fields["extra"] == ["*"]  # dict[str, Any]
    assert fields["xargs"] == ["*"]  # a mapping of scalars: its keys are the body's
    assert fields["by_name"] == ["dict:list:Options"]
    assert fields["nested"] == ["list:list:Hints"]
    assert fields["color"] == []  # an enum
    assert fields["schema"] == ["*"]
    assert fields["tag"] == []  # Literal
    assert fields["free"] == ["*"]
    assert fields["json_value"] == ["*"]  # a recursive alias
    assert fields["plain"] == ["*"]  # a class that is not a model
    assert fields["phased"] == ["Phased", "ext:openai.types.responses.EasyInputMessageParam"]
    assert fields["generic"] == ["*"]  # a TypeVar
    assert fields["bare"] == ["*"]
    assert fields["forward"] == ["list:Options"]
    assert fields["bounded"] == ["list:Options"]


def test_an_alias_of_a_union_is_its_members(schema: Schema) -> None:
    fields = _refs(schema, "Message")
    assert fields["content"] == ["list:Image", "list:Part"]  # and str, which adds nothing
    assert fields["reply"] == ["Message"]  # a forward reference to itself
    assert _refs(schema, "Part") == {"type": [], "text": []}  # Required[Literal[...]]
