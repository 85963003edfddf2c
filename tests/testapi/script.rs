//! The scripted Anthropic Messages API: enough of `POST /v1/messages` for
//! Claude Code to finish one tool-using exchange. The first turn asks for
//! the `Bash` tool to write a file into `/workspace`; the turn that carries
//! its result ends the exchange with `done`; a request without tools (a
//! title or topic side request) gets `ok`.
//!
//! Trusts nothing of the request's shape: anything unexpected is an
//! [`Err`] the caller answers with a 400, never a panic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::body::Bytes;
use serde_json::{Value, json};

/// The command the scripted tool call runs.
pub const COMMAND: &str = "echo credential-proxy-ok > /workspace/agent-wrote.txt";

/// The shell tool's name when the request's `tools` do not name it.
const SHELL_TOOL: &str = "Bash";

/// What the script answers a request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A text block, stop reason `end_turn`.
    Text(&'static str),
    /// A `tool_use` of the shell tool by this name, stop reason `tool_use`.
    ToolUse(String),
}

/// A whole answer: the decision and what fills the message around it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `msg_…`.
    pub id: String,
    /// The request's model, echoed.
    pub model: String,
    /// The content block.
    pub content: Value,
    /// `end_turn` or `tool_use`.
    pub stop_reason: &'static str,
    /// Plausible token counts.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Whether the request asked for server-sent events.
    pub stream: bool,
}

/// The script's decision for a request body.
pub fn decide(request: &Value) -> Result<Decision, String> {
    let request = request
        .as_object()
        .ok_or("the request body is not a JSON object")?;
    let messages = request
        .get("messages")
        .ok_or("messages: field required")?
        .as_array()
        .ok_or("messages: not an array")?;
    let tools = request
        .get("tools")
        .and_then(Value::as_array)
        .filter(|tools| !tools.is_empty());
    let Some(tools) = tools else {
        return Ok(Decision::Text("ok"));
    };
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    let has_result = last_user
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .is_some_and(|blocks| {
            blocks
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        });
    if has_result {
        return Ok(Decision::Text("done"));
    }
    let names = || tools.iter().filter_map(|t| t.get("name")?.as_str());
    let name = names()
        .find(|n| *n == SHELL_TOOL)
        .or_else(|| names().find(|n| n.eq_ignore_ascii_case(SHELL_TOOL)))
        .unwrap_or(SHELL_TOOL);
    Ok(Decision::ToolUse(name.to_owned()))
}

/// A fresh identifier: `prefix` and 24 hex digits, unique in this process.
fn fresh_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}{t:016x}{n:08x}")
}

/// A request id for the `request-id` response header.
pub fn request_id() -> String {
    fresh_id("req_test")
}

/// The whole answer to `request` (`body_len` bytes long).
pub fn reply(request: &Value, body_len: usize) -> Result<Reply, String> {
    let decision = decide(request)?;
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("claude-test")
        .to_owned();
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let (content, stop_reason, output_tokens) = match decision {
        Decision::Text(text) => (json!({"type": "text", "text": text}), "end_turn", 2),
        Decision::ToolUse(name) => (
            json!({
                "type": "tool_use",
                "id": fresh_id("toolu_test"),
                "name": name,
                "input": {"command": COMMAND, "description": "write a file"},
            }),
            "tool_use",
            48,
        ),
    };
    Ok(Reply {
        id: fresh_id("msg_test"),
        model,
        content,
        stop_reason,
        input_tokens: (body_len as u64 / 4).max(1),
        output_tokens,
        stream,
    })
}

fn usage(input_tokens: u64, output_tokens: u64) -> Value {
    json!({
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

/// The answer as one message object (a request without `stream`).
pub fn message(reply: &Reply) -> Value {
    json!({
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [reply.content],
        "stop_reason": reply.stop_reason,
        "stop_sequence": null,
        "usage": usage(reply.input_tokens, reply.output_tokens),
    })
}

/// One server-sent event: `event: NAME\ndata: JSON\n\n`.
pub fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// The answer as the real API streams it, one event per item.
pub fn events(reply: &Reply) -> Vec<Bytes> {
    let mut out = Vec::new();
    out.push(event(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": reply.id,
                "type": "message",
                "role": "assistant",
                "model": reply.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": usage(reply.input_tokens, 1),
            },
        }),
    ));
    // The block starts empty; its content arrives in deltas.
    let (start, deltas) = match reply.content.get("type").and_then(Value::as_str) {
        Some("tool_use") => {
            let mut start = reply.content.clone();
            start["input"] = json!({});
            let input = reply.content["input"].to_string();
            // The real API sends the input in pieces, the first often empty.
            let mid = input.len() / 2;
            let mid = (mid..input.len())
                .find(|i| input.is_char_boundary(*i))
                .unwrap_or(input.len());
            let deltas = ["", &input[..mid], &input[mid..]]
                .iter()
                .map(|piece| json!({"type": "input_json_delta", "partial_json": piece}))
                .collect::<Vec<_>>();
            (start, deltas)
        }
        _ => {
            let text = reply.content.get("text").cloned().unwrap_or(json!(""));
            (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": text})],
            )
        }
    };
    out.push(event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0, "content_block": start}),
    ));
    out.push(event("ping", &json!({"type": "ping"})));
    for delta in deltas {
        out.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ));
    }
    out.push(event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    out.push(event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": reply.stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": reply.output_tokens},
        }),
    ));
    out.push(event("message_stop", &json!({"type": "message_stop"})));
    out
}

/// The JSON error body the real API answers a bad request with.
pub fn error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn bash_tool() -> Value {
        json!([{"name": "Task", "input_schema": {}}, {"name": "Bash", "input_schema": {}}])
    }

    /// Splits a server-sent event stream into (event name, data) pairs,
    /// checking the framing.
    pub(crate) fn parse_sse(stream: &str) -> Vec<(String, Value)> {
        assert!(stream.ends_with("\n\n"), "{stream:?}");
        stream
            .trim_end_matches("\n\n")
            .split("\n\n")
            .map(|event| {
                let (name, data) = event.split_once('\n').expect("two lines");
                let name = name.strip_prefix("event: ").expect("event line");
                let data = data.strip_prefix("data: ").expect("data line");
                assert!(!data.contains('\n'));
                let data: Value = serde_json::from_str(data).expect("JSON data");
                assert_eq!(data["type"], name);
                (name.to_owned(), data)
            })
            .collect()
    }

    #[test]
    fn a_plain_user_turn_gets_the_shell_tool() {
        let request = json!({
            "model": "claude-x",
            "tools": bash_tool(),
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        });
        assert_eq!(decide(&request), Ok(Decision::ToolUse("Bash".into())));
        let request = json!({
            "tools": [{"name": "bash"}],
            "messages": [{"role": "user", "content": "hi"}],
        });
        assert_eq!(decide(&request), Ok(Decision::ToolUse("bash".into())));
        let request = json!({
            "tools": [{"name": "Read"}],
            "messages": [{"role": "user", "content": "hi"}],
        });
        assert_eq!(decide(&request), Ok(Decision::ToolUse("Bash".into())));
    }

    #[test]
    fn a_tool_result_ends_the_turn_and_a_request_without_tools_gets_ok() {
        let request = json!({
            "tools": bash_tool(),
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": ""},
                    {"type": "text", "text": "<system-reminder>"},
                ]},
            ],
        });
        assert_eq!(decide(&request), Ok(Decision::Text("done")));
        let title = json!({"max_tokens": 32, "messages": [{"role": "user", "content": "title?"}]});
        assert_eq!(decide(&title), Ok(Decision::Text("ok")));
        let empty_tools = json!({"tools": [], "messages": []});
        assert_eq!(decide(&empty_tools), Ok(Decision::Text("ok")));
    }

    #[test]
    fn unexpected_shapes_are_errors() {
        for bad in [
            json!([]),
            json!("x"),
            json!({}),
            json!({"messages": {}}),
            json!({"messages": null}),
        ] {
            assert!(decide(&bad).is_err(), "{bad}");
        }
        // Odd but parseable: no user message at all, tools not objects.
        let odd = json!({"tools": [1, "x", {"name": 3}], "messages": [1, {"role": 2}]});
        assert_eq!(decide(&odd), Ok(Decision::ToolUse("Bash".into())));
    }

    #[test]
    fn a_streamed_tool_use_parses_back_to_the_tool_input() {
        let request = json!({
            "model": "claude-x",
            "stream": true,
            "tools": bash_tool(),
            "messages": [{"role": "user", "content": "hi"}],
        });
        let reply = reply(&request, 400).unwrap();
        assert!(reply.stream);
        let stream: String = events(&reply)
            .iter()
            .map(|e| std::str::from_utf8(e).unwrap().to_owned())
            .collect();
        let events = parse_sse(&stream);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(events[0].1["message"]["model"], "claude-x");
        assert_eq!(events[0].1["message"]["role"], "assistant");
        let block = &events[1].1["content_block"];
        assert_eq!(block["type"], "tool_use");
        assert_eq!(block["name"], "Bash");
        assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
        let json: String = events
            .iter()
            .filter(|(n, _)| n == "content_block_delta")
            .map(|(_, d)| {
                assert_eq!(d["delta"]["type"], "input_json_delta");
                d["delta"]["partial_json"].as_str().unwrap().to_owned()
            })
            .collect();
        let input: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            input,
            json!({"command": COMMAND, "description": "write a file"})
        );
        assert_eq!(events[7].1["delta"]["stop_reason"], "tool_use");
        assert!(events[7].1["usage"]["output_tokens"].as_u64().unwrap() > 0);
    }

    #[test]
    fn a_streamed_text_answer_and_a_whole_message() {
        let request = json!({
            "model": "m",
            "tools": bash_tool(),
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
        });
        let reply = reply(&request, 10).unwrap();
        assert!(!reply.stream);
        let whole = message(&reply);
        assert_eq!(whole["content"], json!([{"type": "text", "text": "done"}]));
        assert_eq!(whole["stop_reason"], "end_turn");
        assert_eq!(whole["model"], "m");
        assert!(whole["id"].as_str().unwrap().starts_with("msg_"));
        let stream: String = events(&reply)
            .iter()
            .map(|e| std::str::from_utf8(e).unwrap().to_owned())
            .collect();
        let events = parse_sse(&stream);
        let text: String = events
            .iter()
            .filter(|(n, _)| n == "content_block_delta")
            .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "done");
        let stop = events.iter().find(|(n, _)| n == "message_delta").unwrap();
        assert_eq!(stop.1["delta"]["stop_reason"], "end_turn");
    }
}
