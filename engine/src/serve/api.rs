//! The OpenAI wire format: request fields read and checked (an unknown or unsupported field is a 400 naming it,
//! never ignored), and the JSON of responses, stream chunks and errors.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::scheduler::TokenLogprob;
use crate::generate::FinishReason;

/// An error as the OpenAI API shapes it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    pub(crate) fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub(crate) fn body(&self) -> Value {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param,
                         "code": self.status.as_u16()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// What the prompt is before tokenization.
#[derive(Debug)]
pub(crate) enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    /// The raw request body: `messages` and `tools` are read from it again, keeping each map's key order.
    Messages,
}

/// A checked request.
#[derive(Debug)]
pub(crate) struct Request {
    pub prompt: Prompt,
    pub has_tools: bool,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
}

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
];
const CHAT: &[&str] = &["messages", "max_completion_tokens", "top_logprobs", "tools"];
const COMPLETION: &[&str] = &["prompt", "echo"];

fn number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(key, format!("`{key}` must be a number"))),
    }
}

fn integer(o: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(key, format!("`{key}` must be an integer"))),
    }
}

fn boolean(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad(key, format!("`{key}` must be a boolean"))),
    }
}

/// Parses and checks a request body for `kind`; `model` must be the served name when given.
pub(crate) fn parse(kind: Kind, body: &[u8], model: &str) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            // serde_json's message ends with "at line L column C".
            format!("malformed JSON: {e}"),
        )
    })?;
    let Value::Object(o) = v else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        ));
    };
    let own = match kind {
        Kind::Chat => CHAT,
        Kind::Completion => COMPLETION,
    };
    for k in o.keys() {
        if !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()) {
            return Err(ApiError::bad(k, format!("unsupported field `{k}`")));
        }
    }
    // Fields accepted only at their neutral value.
    for key in ["presence_penalty", "frequency_penalty"] {
        if number(&o, key)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::bad(
                key,
                format!("`{key}` is not supported (only 0)"),
            ));
        }
    }
    if o.get("logit_bias")
        .is_some_and(|b| !b.is_null() && b.as_object().is_none_or(|m| !m.is_empty()))
    {
        return Err(ApiError::bad(
            "logit_bias",
            "`logit_bias` is not supported (only {})",
        ));
    }
    if boolean(&o, "echo")? == Some(true) {
        return Err(ApiError::bad("echo", "`echo` is not supported"));
    }
    match o.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == model => {}
        Some(Value::String(m)) => {
            return Err(ApiError {
                param: Some("model".into()),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("the model `{m}` does not exist; this server serves `{model}`"),
                )
            })
        }
        Some(_) => return Err(ApiError::bad("model", "`model` must be a string")),
    }
    if let Some(n) = integer(&o, "n")? {
        if n != 1 {
            return Err(ApiError::bad("n", "only `n` = 1 is supported"));
        }
    }
    let prompt = match kind {
        Kind::Chat => {
            let Some(Value::Array(msgs)) = o.get("messages") else {
                return Err(ApiError::bad(
                    "messages",
                    "`messages` must be a list of messages",
                ));
            };
            if msgs.is_empty() {
                return Err(ApiError::bad("messages", "`messages` is empty"));
            }
            for (i, m) in msgs.iter().enumerate() {
                if !m.get("role").is_some_and(|r| r.is_string()) {
                    return Err(ApiError::bad(
                        "messages",
                        format!("messages[{i}] needs a string `role`"),
                    ));
                }
            }
            if o.get("tools")
                .is_some_and(|t| !t.is_null() && !t.is_array())
            {
                return Err(ApiError::bad("tools", "`tools` must be a list"));
            }
            Prompt::Messages
        }
        Kind::Completion => match o.get("prompt") {
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                Prompt::Text(a[0].as_str().unwrap_or("").to_string())
            }
            Some(Value::Array(a)) if a.iter().all(|x| x.is_u64()) => Prompt::Ids(
                a.iter()
                    .map(|x| {
                        x.as_u64()
                            .and_then(|x| u32::try_from(x).ok())
                            .unwrap_or(u32::MAX)
                    })
                    .collect(),
            ),
            Some(Value::Array(_)) => return Err(ApiError::bad(
                "prompt",
                "`prompt` must be a string, a list of one string, or a list of token ids (n = 1)",
            )),
            _ => return Err(ApiError::bad("prompt", "`prompt` must be a string")),
        },
    };
    let mut max_tokens = integer(&o, "max_tokens")?;
    let mut max_param = "max_tokens";
    if kind == Kind::Chat {
        if let Some(m) = integer(&o, "max_completion_tokens")? {
            max_tokens = Some(m);
            max_param = "max_completion_tokens";
        }
    }
    if let Some(m) = max_tokens {
        if m < 1 {
            return Err(ApiError::bad(
                max_param,
                format!("`{max_param}` must be at least 1"),
            ));
        }
    }
    let temperature = number(&o, "temperature")?;
    if let Some(t) = temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad(
                "temperature",
                "`temperature` must be between 0 and 2",
            ));
        }
    }
    let top_p = number(&o, "top_p")?;
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad("top_p", "`top_p` must be in (0, 1]"));
        }
    }
    let top_k = match integer(&o, "top_k")? {
        None => None,
        // vLLM's convention: -1 (or 0) turns top-k off.
        Some(-1) | Some(0) => Some(0),
        Some(k) if k > 0 => Some(k as usize),
        Some(_) => return Err(ApiError::bad("top_k", "`top_k` must be -1, 0 or positive")),
    };
    let seed = integer(&o, "seed")?.map(|s| s as u64);
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 && a.iter().all(|x| x.is_string()) => a
            .iter()
            .map(|x| x.as_str().unwrap_or("").to_string())
            .collect(),
        Some(_) => {
            return Err(ApiError::bad(
                "stop",
                "`stop` must be a string or a list of at most 16 strings",
            ))
        }
    };
    if stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::bad("stop", "a stop string is empty"));
    }
    let stream = boolean(&o, "stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => {
            for k in so.keys() {
                if k != "include_usage" {
                    return Err(ApiError::bad(
                        "stream_options",
                        format!("unsupported field `stream_options.{k}`"),
                    ));
                }
            }
            if !stream {
                return Err(ApiError::bad(
                    "stream_options",
                    "`stream_options` needs `stream` = true",
                ));
            }
            boolean(so, "include_usage")?.unwrap_or(false)
        }
        Some(_) => {
            return Err(ApiError::bad(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    let logprobs = match kind {
        Kind::Chat => {
            let on = boolean(&o, "logprobs")?.unwrap_or(false);
            let top = integer(&o, "top_logprobs")?;
            match (on, top) {
                (false, Some(_)) => {
                    return Err(ApiError::bad(
                        "top_logprobs",
                        "`top_logprobs` needs `logprobs` = true",
                    ))
                }
                (false, None) => None,
                (true, None) => Some(0),
                (true, Some(t)) if (0..=20).contains(&t) => Some(t as usize),
                (true, Some(_)) => {
                    return Err(ApiError::bad(
                        "top_logprobs",
                        "`top_logprobs` must be between 0 and 20",
                    ))
                }
            }
        }
        Kind::Completion => match integer(&o, "logprobs")? {
            None => None,
            Some(t) if (0..=5).contains(&t) => Some(t as usize),
            Some(_) => {
                return Err(ApiError::bad(
                    "logprobs",
                    "`logprobs` must be between 0 and 5",
                ))
            }
        },
    };
    Ok(Request {
        prompt,
        has_tools: o.get("tools").is_some_and(|t| t.is_array()),
        max_tokens: max_tokens.map(|m| m as usize),
        temperature: temperature.map(|t| t as f32),
        top_p: top_p.map(|p| p as f32),
        top_k,
        seed,
        stop,
        stream,
        include_usage,
        logprobs,
    })
}

/// The fields every response and chunk carries.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
}

fn finish_str(f: Option<FinishReason>) -> Value {
    match f {
        None => Value::Null,
        Some(FinishReason::Stop) => json!("stop"),
        Some(FinishReason::Length) => json!("length"),
    }
}

pub(crate) fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// Logprobs as each endpoint shapes them; `offset` is the completion text's length before these tokens.
pub(crate) fn logprobs_json(kind: Kind, toks: &[TokenLogprob], mut offset: usize) -> Value {
    match kind {
        Kind::Chat => {
            let entry =
                |t: &str, lp: f32| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
            json!({"content": toks.iter().map(|t| {
                let mut e = entry(&t.text, t.logprob);
                e["top_logprobs"] = Value::Array(t.top.iter().map(|(s, l)| entry(s, *l)).collect());
                e
            }).collect::<Vec<_>>()})
        }
        Kind::Completion => {
            let mut offsets = Vec::new();
            for t in toks {
                offsets.push(offset);
                offset += t.text.len();
            }
            json!({
                "tokens": toks.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
                "token_logprobs": toks.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                "top_logprobs": toks.iter().map(|t| {
                    t.top.iter().map(|(s, l)| (s.clone(), json!(l))).collect::<Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// A whole (not streamed) response.
pub(crate) fn response(
    h: &Head,
    text: &str,
    logprobs: Option<Value>,
    finish: Option<FinishReason>,
    prompt_tokens: usize,
    completion_tokens: usize,
) -> Value {
    let choice = match h.kind {
        Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": logprobs, "finish_reason": finish_str(finish)}),
        Kind::Completion => json!({"index": 0, "text": text, "logprobs": logprobs,
                                   "finish_reason": finish_str(finish)}),
    };
    json!({
        "id": h.id,
        "object": match h.kind { Kind::Chat => "chat.completion", Kind::Completion => "text_completion" },
        "created": h.created,
        "model": h.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    })
}

/// One stream chunk; `role` only on the chat stream's first chunk.
pub(crate) fn chunk(
    h: &Head,
    text: Option<&str>,
    role: bool,
    logprobs: Option<Value>,
    finish: Option<FinishReason>,
    with_usage_field: bool,
) -> Value {
    let choice = match h.kind {
        Kind::Chat => {
            let mut delta = Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = text {
                delta.insert("content".into(), json!(t));
            }
            json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_str(finish)})
        }
        Kind::Completion => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs,
                                   "finish_reason": finish_str(finish)}),
    };
    let mut c = json!({
        "id": h.id,
        "object": match h.kind { Kind::Chat => "chat.completion.chunk", Kind::Completion => "text_completion" },
        "created": h.created,
        "model": h.model,
        "choices": [choice],
    });
    if with_usage_field {
        c["usage"] = Value::Null;
    }
    c
}

/// The last chunk of a stream with `include_usage`: no choices, the usage.
pub(crate) fn usage_chunk(h: &Head, prompt: usize, completion: usize) -> Value {
    json!({
        "id": h.id,
        "object": match h.kind { Kind::Chat => "chat.completion.chunk", Kind::Completion => "text_completion" },
        "created": h.created,
        "model": h.model,
        "choices": [],
        "usage": usage(prompt, completion),
    })
}
