"""What an engine declares for an endpoint's body (strict_body routes): a synthetic
catalog in the inventory's reference form, and the committed one."""

import pytest

from ext_proc.core import declared

CATALOG = {
    "engines": {
        "toy 1.0": {
            "endpoints": {"/v1/chat/completions": "Chat", "/raw": None},
            "models": {
                "Chat": {
                    "messages": ["list:Message"],
                    "model": [],
                    "extra": ["*"],
                    "tools": ["list:ext:openai.Tool"],
                    "named": ["dict:Message"],
                    "grid": ["list:list:Message"],
                    "either": ["Message", "Other"],
                    "tree": ["Node"],
                },
                "Message": {"role": [], "content": []},
                "Other": {"note": []},
                "Node": {"child": ["Node"], "value": []},
            },
        }
    }
}


@pytest.fixture(autouse=True)
def toy(monkeypatch):
    monkeypatch.setattr(declared, "_catalog", lambda: CATALOG)
    declared._models.cache_clear()
    yield
    declared._models.cache_clear()


def body(endpoint="/v1/chat/completions"):
    found = declared.body("toy 1.0", endpoint)
    assert found is not None
    return found


def undeclared(document, most=64):
    return declared.undeclared(document, body(), most)


def test_declared_members_pass_and_others_are_named_where_they_are():
    document = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}, {"role": "user", "rid": "x"}],
        "input_ids": [1, 2],
    }
    assert undeclared(document) == (("messages", 1, "rid"), ("input_ids",))


def test_open_types_declare_everything_below_them():
    document = {"extra": {"anything": {"at": "all"}}, "tools": [{"type": "function", "x": 1}]}
    assert undeclared(document) == ()


def test_mappings_lists_of_lists_and_unions():
    document = {
        "named": {"a": {"role": "r"}, "b": {"bootstrap_host": "h"}},
        "grid": [[{"role": "r"}], [{"content": "c", "rid": 1}]],
        "either": {"role": "r", "note": "n", "input_embeds": []},
    }
    assert undeclared(document) == (
        ("named", "b", "bootstrap_host"),
        ("grid", 1, 0, "rid"),
        ("either", "input_embeds"),
    )


def test_a_self_referring_model_is_checked_to_a_bounded_depth():
    node: dict = {"value": 1}
    document = {"tree": node}
    for _ in range(5000):
        node["child"] = {"value": 1}
        node = node["child"]
    (deepest,) = undeclared(document)
    assert len(deepest) == declared.MAX_DEPTH + 1


def test_the_search_stops_at_most():
    document = {f"k{i}": i for i in range(100)}
    assert len(undeclared(document, most=3)) == 3


def test_endpoints_match_behind_a_root_path_and_a_trailing_slash():
    assert declared.body("toy 1.0", "/x/v1/chat/completions/").root == "Chat"
    assert declared.body("toy 1.0", "/v1/chat/completions2") is None
    assert declared.body("toy 1.0", "/raw").root is None
    assert declared.undeclared({"anything": 1}, declared.body("toy 1.0", "/raw"), 64) == ()
    assert declared.body("other 1.0", "/raw") is None
    assert declared.engines() == frozenset({"toy 1.0"})
