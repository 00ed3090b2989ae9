"""One wording for pydantic's errors: each error's dotted location and message."""

import pydantic
import pytest

from ext_proc.core.validation import problems


class Inner(pydantic.BaseModel):
    port: int


class Outer(pydantic.BaseModel):
    name: str
    items: list[Inner]


def test_each_error_is_named_by_its_dotted_location():
    with pytest.raises(pydantic.ValidationError) as caught:
        Outer.model_validate({"name": 1, "items": [{"port": 1}, {"port": "x"}]})
    assert problems(caught.value) == (
        "name: Input should be a valid string; "
        "items.1.port: Input should be a valid integer, unable to parse string as an integer"
    )


def test_an_error_of_the_whole_input_is_named_root():
    with pytest.raises(pydantic.ValidationError) as caught:
        Outer.model_validate("not a mapping")
    assert problems(caught.value).startswith("(root): ")
