import re
import warnings

import pytest

from ext_proc.tools.route_match import (
    URI_TEMPLATE,
    PathMatcher,
    Unreadable,
    read_matcher,
    regex_rewrite,
    template_regex,
    upstream_path,
)


def template(path_template):
    return {
        "path_match_policy": {
            "name": URI_TEMPLATE,
            "typed_config": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig",
                "path_template": path_template,
            },
        }
    }


@pytest.mark.parametrize(
    ("match", "path", "matched"),
    [
        # A prefix sees the query string too; the other matchers do not.
        ({"prefix": "/v1/"}, "/v1/chat", True),
        ({"prefix": "/v1/chat?x"}, "/v1/chat?x=1", True),
        ({"prefix": "/V1/"}, "/v1/chat", False),
        ({"prefix": "/V1/", "case_sensitive": False}, "/v1/chat", True),
        ({"path": "/v1/chat"}, "/v1/chat?x=1", True),
        ({"path": "/V1/CHAT", "case_sensitive": False}, "/v1/chat", True),
        # A path-separated prefix: the prefix itself, or followed by "/".
        ({"path_separated_prefix": "/pd/v1"}, "/pd/v1", True),
        ({"path_separated_prefix": "/pd/v1"}, "/pd/v1/chat?x=1", True),
        ({"path_separated_prefix": "/pd/v1"}, "/pd/v10/chat", False),
        ({"path_separated_prefix": "/PD/v1", "case_sensitive": False}, "/pd/V1/x", True),
        # RE2, whole path without the query string; case_sensitive does not apply.
        ({"safe_regex": {"regex": "/v1/.*"}}, "/v1/chat?x=1", True),
        ({"safe_regex": {"regex": "/v1/.*"}, "case_sensitive": False}, "/V1/chat", False),
        ({"safe_regex": {"regex": "/v1"}}, "/v1/chat", False),
        # RE2 takes "(?i)" anywhere and reads POSIX classes (Python's re does neither).
        ({"safe_regex": {"regex": "/v1/(?i)CHAT"}}, "/v1/chat", True),
        ({"safe_regex": {"regex": "/[[:alpha:]]+/.*"}}, "/inference/v1/generate", True),
        ({"safe_regex": {"regex": "[[:print:]]*"}}, "/v1/chat/completions/render", True),
        # URI templates: "*" and {name} one segment, "**" any number.
        (template("/{model}/**"), "/x/inference/v1/generate", True),
        (template("/{model}/**"), "/x", False),
        (template("/v1/*/render"), "/v1/chat/render", True),
        (template("/v1/*/render"), "/v1/chat/completions/render", False),
        (template("/v1/{rest=**}"), "/v1/a/b?x=1", True),
        (template("/v1/"), "/v1/", True),
    ],
)
def test_matchers_match_as_envoy_does(match, path, matched):
    assert read_matcher(match).matches(path) is matched


def test_python_re_reads_the_posix_class_as_something_else():
    # Why RE2: to Python "[[:alpha:]]+" is a set of "[:alph" followed by "]"s.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert re.fullmatch("/[[:alpha:]]+/.*", "/inference/v1/generate") is None


@pytest.mark.parametrize(
    ("match", "text"),
    [
        ({"safe_regex": {"regex": "(?<=a)b"}}, "RE2 cannot compile"),
        ({"safe_regex": {"regex": "(a"}}, "RE2 cannot compile"),
        ({"safe_regex": {}}, "without a regex"),
        ({"connect_matcher": {}}, "a path matcher of ['connect_matcher']"),
        ({}, "a path matcher of nothing"),
        (template("/v1/{x}.json"), "URI template segment"),
        (template("/v1/**/x"), "'**' before the last segment"),
        (template("v1/*"), "does not start with '/'"),
        (template("/v1/{1x}"), "URI template variable"),
        ({"path_match_policy": {"name": "other"}}, "path_match_policy 'other'"),
    ],
)
def test_what_cannot_be_read_exactly_is_refused(match, text):
    with pytest.raises(Unreadable, match=re.escape(text)):
        read_matcher(match)


def test_a_template_is_converted_as_envoy_converts_it():
    pchar = "a-zA-Z0-9-._~%!$&'()+,;:@"
    assert template_regex("/v1/{m}/**") == f"/v1/[{pchar}]+/[{pchar}/]*"
    assert template_regex("/a.b/*/") == rf"/a\.b/[{pchar}]+/"


def test_heads_are_the_literal_starts_of_prefix_and_path_matchers():
    assert read_matcher({"prefix": "/v1/"}).head() == "/v1/"
    assert read_matcher({"path": "/health"}).head() == "/health"
    assert read_matcher({"safe_regex": {"regex": "/v1/.*"}}).head() is None
    assert read_matcher(template("/v1/**")).head() is None


@pytest.mark.parametrize(
    ("pattern", "substitution", "path", "upstream"),
    [
        ("^/legacy/(.*)", r"/\1", "/legacy/inference/v1?x=1", "/inference/v1?x=1"),
        # Every match replaced (RE2::GlobalReplace), \0 the whole match.
        ("o", "0", "/foo/boo", "/f00/b00"),
        ("/v1", r"\0\0", "/v1/x", "/v1/v1/x"),
        (r"/(\w+)/(\w+)", r"/\2/\1", "/a/b", "/b/a"),
        ("x", r"\\", "/x", "/\\"),
        # RE2's POSIX classes in the pattern too.
        ("^/[[:alpha:]]+/", "/inference/", "/api/v1/generate", "/inference/v1/generate"),
    ],
)
def test_regex_rewrite_replaces_as_re2_does(pattern, substitution, path, upstream):
    assert regex_rewrite(pattern, substitution, path) == upstream


@pytest.mark.parametrize(
    ("pattern", "substitution"),
    [("x*", "y"), ("(a)", r"\2"), ("a", r"\n"), ("(?<=a)", "b")],
)
def test_regex_rewrites_not_evaluated_exactly_are_refused(pattern, substitution):
    with pytest.raises(Unreadable):
        regex_rewrite(pattern, substitution, "/xa")


@pytest.mark.parametrize(
    ("match", "action", "path", "upstream"),
    [
        ({"prefix": "/pd/v1/"}, {"prefix_rewrite": "/v1/"}, "/pd/v1/chat?x=1", "/v1/chat?x=1"),
        ({"path_separated_prefix": "/pd/v1"}, {"prefix_rewrite": "/v1"}, "/pd/v1/x", "/v1/x"),
        ({"safe_regex": {"regex": "/a/.*"}}, {}, "/a/render", "/a/render"),
        (
            {"prefix": "/"},
            {"regex_rewrite": {"pattern": {"regex": "^/api"}, "substitution": ""}},
            "/api/inference/v1/generate",
            "/inference/v1/generate",
        ),
    ],
)
def test_upstream_paths(match, action, path, upstream):
    assert upstream_path(match, action, path) == upstream


@pytest.mark.parametrize(
    ("match", "action"),
    [
        ({"safe_regex": {"regex": "/a/.*"}}, {"prefix_rewrite": "/b/"}),
        ({"path": "/a"}, {"prefix_rewrite": "/b"}),
        ({"prefix": "/"}, {"path_rewrite_policy": {}}),
        ({"prefix": "/"}, {"regex_rewrite": {"pattern": {}}}),
    ],
)
def test_rewrites_that_cannot_be_followed_are_refused(match, action):
    with pytest.raises(Unreadable):
        upstream_path(match, action, "/a")


def test_a_matcher_is_a_value():
    assert read_matcher({"prefix": "/v1/"}) == PathMatcher("prefix", "/v1/")
