"""stacks: each scanner on tiny synthetic sources committed to bare git repositories
(no network), the command line, and the committed snapshot's shape."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from devstack.inventory import stacks
from devstack.inventory.stacks import (
    PLANS,
    GoMapReads,
    GoRoot,
    GoSource,
    StacksError,
    Tree,
    blank_comments,
    go_headers,
    go_map_reads,
    go_struct_reads,
    main,
)

GIT = [
    "git",
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.com",
    "-c",
    "init.defaultBranch=main",
]


def bare_repo(root: Path, files: dict[str, str], *, tag: str | None = None) -> Path:
    """A bare repository whose one commit holds ``files``."""
    gitdir, work = root / "repo.git", root / "work"
    work.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q", "--bare", str(gitdir)], check=True)
    for path, text in files.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    tree = [*GIT, "--git-dir", str(gitdir), "--work-tree", str(work)]
    subprocess.run([*tree, "add", "-A"], check=True)
    subprocess.run([*tree, "commit", "-q", "-m", "sources"], check=True)
    if tag:
        subprocess.run([*tree, "tag", tag], check=True)
    return gitdir


def go(files: dict[str, str]) -> GoSource:
    return GoSource.load(files, "module example.com/stack\n")


# --- reading a bare git directory ----------------------------------------------------


def test_a_tree_reads_files_at_a_commit(tmp_path):
    gitdir = bare_repo(tmp_path, {"a/x.go": "package a\n", "b/y.rs": "fn f() {}\n"}, tag="v1")
    tree = Tree.open(gitdir, "v1")
    assert re.fullmatch(r"[0-9a-f]{40}", tree.commit)
    assert Tree.open(gitdir).commit == tree.commit
    assert tree.paths(["a"]) == ["a/x.go"]
    assert tree.paths(()) == ["a/x.go", "b/y.rs"]
    assert tree.read(["b/y.rs", "a/x.go", "nope"]) == {
        "b/y.rs": "fn f() {}\n",
        "a/x.go": "package a\n",
    }


def test_a_missing_revision_or_directory_is_an_error(tmp_path):
    gitdir = bare_repo(tmp_path, {"x": "1"})
    with pytest.raises(StacksError, match="no commit"):
        Tree.open(gitdir, "v9")
    with pytest.raises(StacksError, match="no commit"):
        Tree.open(tmp_path / "absent")


def test_comments_are_blanked_strings_kept_lines_kept():
    text = 'a := "http://x" // r.Header.Get("x-hidden")\n/* b\n c */ d := \'"\' + `//e`\n'
    blanked = blank_comments(text)
    assert blanked.count("\n") == text.count("\n")
    assert '"http://x"' in blanked
    assert "x-hidden" not in blanked
    assert " c " not in blanked
    assert "`//e`" in blanked
    python = 'h = headers.get("x-a")  # headers.get("x-b")\ns = "# not a comment"\n'
    comment = '# headers.get("x-b")'
    assert blank_comments(python, python=True) == python.replace(comment, " " * len(comment))


# --- Go ------------------------------------------------------------------------------

ROUTING_GO = """package routing

const (
	// PrefillHeader names the prefill pod.
	PrefillHeader = "x-prefiller-host-port"
	Other         = "not a header name"
	Alias         = PrefillHeader
)
"""

PROXY_GO = """package proxy

import (
	"net/http"

	rt "example.com/stack/pkg/routing"
)

const localHeader = "X-Local-Thing"

func handle(r *http.Request, resp *http.Response) {
	a := r.Header.Values(rt.PrefillHeader)
	b := r.Header.Get(localHeader)
	c := r.Header.Get("User-Agent")
	d := resp.Header.Get("x-response-only")
	// e := r.Header.Get("x-in-a-comment")
	f := r.Header.Get(rt.Other)
	g := r.Header.Get(":path")
}
"""

PICKER_GO = """package picker

var defaultPriorityHeaders = []string{
	ClaudeHeader,
	"session-id",
}

const (
	ClaudeHeader      = "x-claude-session"
	defaultHeaderName = "EPP-Profile"
	Key               = "x-new-name"
	OldKey            = "x-old-name"
)

var aliases = map[string][]string{
	Key: {Key, OldKey},
}

type Handler struct{ headerName string; priorityHeaders []string }

func (h *Handler) Pick(request *Request) string {
	profile := request.Headers[h.headerName]
	for _, header := range h.priorityHeaders {
		if id := request.Headers[header]; id != "" {
			return id
		}
	}
	value, _ := GetLowerCaseHeaderValue(request.Headers, Key)
	request.Headers["x-written-not-read"] = profile
	return value
}
"""


def test_go_headers_follow_constants_across_packages_and_skip_responses():
    source = go({"pkg/routing/r.go": ROUTING_GO, "pkg/proxy/p.go": PROXY_GO})
    found = go_headers(source, ["pkg/proxy"])
    assert sorted(found) == ["user-agent", "x-local-thing", "x-prefiller-host-port"]
    assert found["x-prefiller-host-port"] == {"pkg/proxy/p.go:12"}
    # Only the directories asked for are read.
    assert go_headers(source, ["pkg/routing"]) == {}


def test_go_headers_of_a_map_defaults_lists_and_alias_tables():
    found = go_headers(go({"pkg/picker/h.go": PICKER_GO}), ["pkg"])
    assert sorted(found) == [
        "epp-profile",
        "session-id",
        "x-claude-session",
        "x-new-name",
        "x-old-name",
    ]


def test_go_test_and_generated_files_are_not_read():
    source = go(
        {
            "pkg/proxy/p_test.go": PROXY_GO,
            "pkg/proxy/x.pb.go": PROXY_GO,
            "pkg/proxy/testdata/p.go": PROXY_GO,
        }
    )
    assert source.files == {}


TYPES_GO = """package types

import "example.com/stack/pkg/media"

type Body struct {
	Chat    *ChatRequest     `json:"chat,omitempty"`
	Gen     *GenerateRequest `json:"generate,omitempty"`
	Payload any              `json:"-"`
	Mutated bool
}

type ChatRequest struct {
	Base
	Messages []Message        `json:"messages,omitempty"`
	Options  map[string]Knob  `json:"options"`
	Hidden   string           `json:"-"`
	Internal string
	Image    media.Image      `json:"image"`
}

type Base struct {
	Model string `json:"model"`
}

type Knob struct {
	Level int `json:"level"`
}

type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

type Content struct {
	Raw   string
	Parts []Part
}

type Part struct {
	Type string `json:"type"`
}

func (c *Content) UnmarshalJSON(data []byte) error {
	var text string
	if err := json.Unmarshal(data, &text); err == nil {
		return nil
	}
	var parts []Part
	return json.Unmarshal(data, &parts)
}

type GenerateRequest struct {
	TokenIDs []uint32 `json:"ignored_because_decoded_by_hand"`
}

func (r *GenerateRequest) UnmarshalJSON(data []byte) error {
	var raw struct {
		TokenIDs []float64 `json:"token_ids"`
		Features *struct {
			Hashes map[string][]string `json:"mm_hashes"`
		} `json:"features,omitempty"`
	}
	return json.Unmarshal(data, &raw)
}
"""

MEDIA_GO = """package media

type Image struct {
	URL string `json:"url"`
}
"""


def test_go_struct_reads_from_an_envelope():
    source = go({"pkg/types/t.go": TYPES_GO, "pkg/media/m.go": MEDIA_GO})
    found = go_struct_reads(source, [GoRoot("pkg/types", "Body", envelope=True)])
    assert sorted(found) == [
        "features",
        "features.mm_hashes",
        "image",
        "image.url",
        "messages",
        "messages.*.content",
        "messages.*.content.*.type",
        "messages.*.role",
        "model",
        "options",
        "options.*.level",
        "token_ids",
    ]


def test_go_struct_reads_from_one_type():
    source = go({"pkg/types/t.go": TYPES_GO, "pkg/media/m.go": MEDIA_GO})
    assert sorted(go_struct_reads(source, [GoRoot("pkg/types", "Knob")])) == ["level"]
    assert go_struct_reads(source, [GoRoot("pkg/types", "Absent")]) == {}


SIDECAR_GO = """package sidecar

const (
	fieldKV      = "kv_transfer_params"
	fieldStream  = "stream"
	fieldPrompt  = "prompt"
)

func handle(completionRequest map[string]any) {
	stream, ok := completionRequest[fieldStream]
	completionRequest[fieldKV] = map[string]any{"do_remote_decode": true}
	kv := completionRequest[fieldKV].(map[string]any)
	delete(completionRequest, fieldPrompt)
	if messages, ok := completionRequest["messages"].([]any); ok {
		for _, m := range messages {
			msg, ok := m.(map[string]any)
			parts, _ := msg["content"].([]any)
			for _, p := range parts {
				part := p.(map[string]any)
				if part["type"] == "image_url" {
					url := part["image_url"].(map[string]any)["url"]
				}
			}
			msg = other
			_ = msg["not_followed"]
		}
	}
	limit := MaxTokens(completionRequest, "max_tokens", "max_completion_tokens")
	response := map[string]any{}
	_ = response["choices"]
}

func other(params map[string]any) {
	_ = params["outside"]
}
"""


def test_go_map_reads_follow_bindings_within_a_function():
    source = go({"pkg/sidecar/s.go": SIDECAR_GO})
    plan = GoMapReads(("pkg/sidecar",), ("completionRequest",), ("MaxTokens",))
    found = go_map_reads(source, plan)
    assert sorted(found) == [
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "messages.*.content",
        "messages.*.content.*.image_url",
        "messages.*.content.*.type",
        "stream",
    ]
    # Read after the function wrote it: its own value, not the client's.
    assert "kv_transfer_params" not in found
    assert found["stream"] == {"pkg/sidecar/s.go:10"}


# --- Rust ----------------------------------------------------------------------------

NVEXT_RS = """use axum::http::HeaderMap;

pub const HEADER_WORKER: &str = "x-dynamo-worker";
pub const HEADER_WORKER_ALIAS: &str = "x-worker";
const NOT_READ: &str = "x-never-read";

pub fn overrides(headers: &HeaderMap) {
    let worker = headers
        .get(HEADER_WORKER)
        .or_else(|| headers.get(HEADER_WORKER_ALIAS))
        .and_then(|v| v.to_str().ok());
    // headers.get("x-commented")
}

/// Extensions.
#[derive(Serialize, Deserialize)]
pub struct NvExt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_data: Option<Vec<u32>>,

    #[serde(rename = "backend_id", alias = "instance_id")]
    pub backend_instance_id: Option<u64>,

    #[serde(skip)]
    pub internal: bool,

    pub hints: Option<Vec<Hint>>,

    pub mode: Option<Mode>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hint {
    pub max_tokens: Option<HashMap<String, u32>>,
}

#[serde(rename_all = "snake_case")]
pub enum Mode {
    Fast,
}

#[cfg(test)]
mod tests {
    fn t(headers: &HeaderMap) {
        headers.get("x-only-in-tests");
    }
}
"""

CHAT_RS = """use super::nvext::NvExt;

#[derive(Deserialize)]
pub struct NvCreateChatRequest {
    #[serde(flatten)]
    pub inner: protocols::types::CreateChatCompletionRequest,

    #[serde(flatten, default)]
    pub common: CommonExt,

    pub nvext: Option<NvExt>,

    #[serde(default, alias = "chat_template_kwargs")]
    pub chat_template_args: Option<HashMap<String, Value>>,

    #[serde(flatten, default, skip_serializing)]
    pub unsupported_fields: HashMap<String, Value>,
}

pub struct CommonExt {
    pub ignore_eos: Option<bool>,
}

pub struct NvCreateUnusedRequest {
    pub not_extracted: bool,
}
"""

IMAGES_RS = """mod nvext;
pub use nvext::NvExt;

pub struct NvCreateImageRequest {
    #[serde(flatten)]
    pub inner: upstream::types::CreateImageRequest,
    pub prompt: String,
    pub nvext: Option<NvExt>,
}
"""

IMAGES_NVEXT_RS = """pub struct NvExt {
    pub guidance: Option<f32>,
}
"""

AGENTS_RS = """pub(crate) const HEADER_SESSION: &str = "x-agent-session";
pub(crate) const HEADER_PARENT: &str =
    "x-agent-parent";
pub(crate) const HEADER_FINAL: &str = "x-agent-final";

struct Mapping {
    root_header: &'static str,
    parent_header: Option<&'static str>,
}

const MAPPINGS: &[Mapping] = &[Mapping {
    root_header: HEADER_SESSION,
    parent_header: Some(HEADER_PARENT) }];

fn values(headers: &HeaderMap) -> Option<bool> {
    flag(headers, HEADER_FINAL)
}
"""

SERVICE_RS = """async fn chat(headers: HeaderMap, Json(mut request): Json<NvCreateChatRequest>) {}

async fn images(Json(request): Json<openai::NvCreateImageRequest>) -> Result<(), Json<Error>> {}

fn id(request: &Request) {
    let a = request.headers().get("X-Request-Id").cloned();
    let b = req.headers.contains_key(header::AUTHORIZATION);
}
"""


PROTOCOL_TYPES_RS = """pub struct CreateChatCompletionRequest {
    pub messages: Vec<Message>,
    pub reasoning_effort: Option<Effort>,
    pub tool_choice: Option<Choice>,
}

#[derive(Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    User(UserMessage),
    System { content: String },
}

pub struct UserMessage {
    pub content: Content,
}

#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[serde(tag = "type")]
#[serde(rename_all = "snake_case")]
pub enum Part {
    ImageUrl(ImagePart),
    #[serde(rename = "input_text")]
    Text { text: String },
}

pub struct ImagePart {
    pub image_url: Url,
}

pub struct Url {
    pub url: String,
}

pub enum Effort {
    Low,
    High = 2,
}

#[serde(rename_all = "snake_case")]
pub enum Choice {
    Auto,
    Named(NamedChoice),
    Pair(String, u32),
}

pub struct NamedChoice {
    pub name: String,
}
"""


def _dynamo_files() -> dict[str, str]:
    return {
        "lib/llm/src/protocols/openai/nvext.rs": NVEXT_RS,
        "lib/llm/src/protocols/openai/chat.rs": CHAT_RS,
        "lib/llm/src/protocols/openai/images.rs": IMAGES_RS,
        "lib/llm/src/protocols/openai/images/nvext.rs": IMAGES_NVEXT_RS,
        "lib/llm/src/http/service/openai.rs": SERVICE_RS,
        "lib/llm/src/protocols/agents.rs": AGENTS_RS,
        "lib/protocols/src/types/chat.rs": PROTOCOL_TYPES_RS,
        "lib/llm/tests/http.rs": 'fn t(headers: H) { headers.get("x-test-dir"); }',
        "lib/runtime/src/x.rs": 'fn t(headers: H) { headers.get("x-other-crate"); }',
    }


DYNAMO_HEADERS = [
    "authorization",
    "x-agent-final",
    "x-agent-parent",
    "x-agent-session",
    "x-dynamo-worker",
    "x-request-id",
    "x-worker",
]


def test_rust_headers_consts_chains_helpers_tables_and_standard_names(tmp_path):
    reading = stacks.read_component(
        PLANS["dynamo"], Tree.open(bare_repo(tmp_path, _dynamo_files()))
    )
    assert sorted(reading.headers) == DYNAMO_HEADERS
    assert reading.headers["x-worker"] == {"lib/llm/src/protocols/openai/nvext.rs:10"}


def test_rust_serde_reads_from_the_extracted_request_types(tmp_path):
    reading = stacks.read_component(
        PLANS["dynamo"], Tree.open(bare_repo(tmp_path, _dynamo_files()))
    )
    assert sorted(reading.reads) == [
        "chat_template_args",
        "chat_template_kwargs",
        "ignore_eos",
        "messages",
        "messages.*.content",
        "messages.*.content.*.image_url",
        "messages.*.content.*.image_url.url",
        "messages.*.content.*.text",
        "messages.*.content.*.type",
        "messages.*.role",
        "nvext",
        "nvext.backend_id",
        "nvext.guidance",
        "nvext.hints",
        "nvext.hints.*.maxTokens",
        "nvext.instance_id",
        "nvext.mode",
        "nvext.token_data",
        "prompt",
        "reasoning_effort",
        "tool_choice",
        "tool_choice.named",
        "tool_choice.named.name",
    ]


# --- Python --------------------------------------------------------------------------

CONSTANTS_PY = 'KEY_HEADER = "x-kv-token-key"\nMODEL_ID = "serve_multiplexed_model_id"\n'

SERVER_PY = """from .constants import KEY_HEADER, MODEL_ID

class Router:
    def route(self, request, raw):
        key = raw.headers.get(KEY_HEADER)
        target = raw.headers["x-gateway-destination-endpoint"]
        for name, value in scope["headers"]:
            if name.lower() == b"x-request-id":
                pass
            if name.decode() == MODEL_ID:
                pass
        # raw.headers.get("x-commented")
        params = getattr(request, "kv_transfer_params", None)
        host = request.kv_transfer_params.get("remote_host")
        port = kv_transfer_params["remote_port"]
        kv_transfer_params["prompt_token_ids"] = ids
        other = getattr(response, "usage", None)
        streamed = hasattr(request, "stream")

    async def chat(self, body, request):
        model_id = await self._get_model_id(body.model)
        body.options = None
        copy = body.model_copy()
        return request.state
"""


def test_python_headers_and_body_reads(tmp_path):
    files = {
        "python/ray/serve/_private/constants.py": CONSTANTS_PY,
        "python/ray/llm/_internal/serve/router.py": SERVER_PY,
        "python/ray/llm/_internal/serve/tests/test_router.py": 'headers.get("x-test")\n',
    }
    reading = stacks.read_component(PLANS["ray-serve"], Tree.open(bare_repo(tmp_path, files)))
    assert sorted(reading.headers) == [
        "serve_multiplexed_model_id",
        "x-gateway-destination-endpoint",
        "x-kv-token-key",
        "x-request-id",
    ]
    assert sorted(reading.reads) == [
        "kv_transfer_params",
        "kv_transfer_params.remote_host",
        "kv_transfer_params.remote_port",
        "model",
        "stream",
    ]


# --- the command line and the snapshot -------------------------------------------------


def test_main_writes_the_source_and_keeps_the_others(tmp_path):
    gitdir = bare_repo(tmp_path / "dynamo", _dynamo_files())
    commit = Tree.open(gitdir).commit
    out = tmp_path / "stacks.json"
    out.write_text(
        stacks.dumps(
            {
                "generated_by": stacks.GENERATED_BY,
                "sources": {
                    "dynamo 000000000000": {"engine": "dynamo"},
                    "ray-serve 111111111111": {"engine": "ray-serve"},
                },
            }
        )
    )
    assert main(["--tree", f"dynamo={gitdir}@HEAD", "--out", str(out)]) == 0
    text = out.read_text()
    document = json.loads(text)
    assert text == stacks.dumps(document)
    assert sorted(document["sources"]) == [f"dynamo {commit[:12]}", "ray-serve 111111111111"]
    source = document["sources"][f"dynamo {commit[:12]}"]
    assert source["origin"] == f"github:ai-dynamo/dynamo@{commit}"
    assert source["refresh"] == (
        f"python -m devstack.inventory stacks --tree dynamo=$GITDIR@{commit}"
    )
    assert source["headers"] == DYNAMO_HEADERS
    assert source["release"] == commit[:12]


def test_main_refuses_an_unknown_component_or_commit(tmp_path, capsys):
    out = tmp_path / "stacks.json"
    assert main(["--tree", f"vllm={tmp_path}", "--out", str(out)]) == 2
    assert main(["--tree", f"dynamo={tmp_path}@v1", "--out", str(out)]) == 2
    assert not out.exists()
    assert "NAME must be one of llm-d-router" in capsys.readouterr().err


SNAPSHOT = Path(stacks.__file__).with_name("stacks.json")


def _snapshot() -> dict[str, dict[str, object]]:
    document = json.loads(SNAPSHOT.read_text())
    assert SNAPSHOT.read_text() == stacks.dumps(document)
    assert document["generated_by"] == stacks.GENERATED_BY
    return document["sources"]


def test_the_snapshot_has_one_source_per_component_with_its_provenance():
    sources = _snapshot()
    assert sorted(source["engine"] for source in sources.values()) == sorted(PLANS)
    for key, source in sources.items():
        plan = PLANS[source["engine"]]
        sha = source["origin"].rpartition("@")[2]
        assert re.fullmatch(r"[0-9a-f]{40}", sha)
        assert key == f"{plan.name} {sha[:12]}" == f"{source['engine']} {source['release']}"
        assert source["origin"] == f"github:{plan.repository}@{sha}"
        assert source["refresh"] == f"{stacks.GENERATED_BY} --tree {plan.name}=$GITDIR@{sha}"
        for name in ("headers", "reads", "part_types", "connector_keys"):
            assert source[name] == sorted(set(source[name]))
        assert all(h == h.lower() for h in source["headers"])


def test_the_snapshot_holds_the_carriers_known_from_the_sources():
    by_engine = {source["engine"]: source for source in _snapshot().values()}
    sidecar = set(by_engine["llm-d-sidecar"]["headers"])
    assert {
        "x-prefiller-host-port",
        "x-encoder-hosts-ports",
        "x-kv-cache-source-host-port",
        "x-data-parallel-host-port",
    } <= sidecar
    assert "epp-profile" in by_engine["llm-d-router"]["headers"]
    assert {"token_ids", "messages.*.content.*.type"} <= set(by_engine["llm-d-router"]["reads"])
    dynamo = by_engine["dynamo"]
    assert {"x-worker-instance-id", "x-prefill-instance-id", "x-dp-rank"} <= set(dynamo["headers"])
    assert {
        "nvext.token_data",
        "nvext.backend_instance_id",
        "nvext.prefill_worker_id",
        "nvext.decode_worker_id",
        "nvext.dp_rank",
        "nvext.prefill_dp_rank",
    } <= set(dynamo["reads"])
    assert "kv_transfer_params" in by_engine["ray-serve"]["reads"]
