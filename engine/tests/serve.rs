//! `edgefit serve` in process: every endpoint and error through `tower::ServiceExt::oneshot` on the router, a
//! greedy completion against `generate` on the same prompt, concurrent streams (some cancelled mid-stream) against
//! their single-request tokens, the bounded queue's 429, cancellation freeing a slot, and graceful shutdown over a
//! real loopback socket. The model is the `qwen3-f32` fixture (random weights, byte-level tokenizer, ChatML).

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use engine::chat::ChatTemplate;
use engine::checkpoint::Checkpoint;
use engine::generate::{generate, GenerateOptions};
use engine::serve::{ServeConfig, Server};
use engine::tokenizer::{GenerationConfig, Tokenizer};
use engine::{Engine, Model, WeightMode};
use futures_util::StreamExt;
use kernels::sampling::SamplingParams;
use serde_json::{json, Value};
use tower::ServiceExt;

const NAME: &str = "fixture";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-f32")
}

fn engine(slots: usize, max_len: usize) -> Engine {
    let ck = Checkpoint::open(&fixture()).unwrap();
    let model = Model::load(&ck, WeightMode::Exact, |_, _| {}).unwrap();
    Engine::new(model, slots, max_len).unwrap()
}

struct Opts {
    slots: usize,
    max_len: usize,
    key: Option<&'static str>,
    max_queue: usize,
    body: usize,
    /// Stop at the fixture's end-of-turn token (off where a request must run to its token budget).
    stop_at_eos: bool,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            slots: 4,
            max_len: 128,
            key: None,
            max_queue: 64,
            body: 1 << 20,
            stop_at_eos: true,
        }
    }
}

fn server(o: Opts) -> Server {
    let dir = fixture();
    let cfg = ServeConfig {
        model_name: NAME.into(),
        api_key: o.key.map(String::from),
        max_queue: o.max_queue,
        max_body_bytes: o.body,
        stop_tokens: if o.stop_at_eos { vec![258] } else { vec![] },
        defaults: GenerationConfig::open(&dir).unwrap(),
    };
    Server::start(
        engine(o.slots, o.max_len),
        Tokenizer::open(&dir).unwrap(),
        ChatTemplate::open(&dir).unwrap(),
        cfg,
    )
    .unwrap()
}

fn post(uri: &str, body: &Value) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let r = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

async fn json_call(app: &Router, uri: &str, body: &Value) -> (StatusCode, Value) {
    let (s, _, text) = send(app, post(uri, body)).await;
    (
        s,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// The `data:` payloads of an SSE body.
fn sse_data(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

/// The greedy text `generate` produces for `prompt` on a fresh single-slot engine, and its token count.
fn reference(prompt: &[u32], max_new: usize) -> (String, usize) {
    reference_with(prompt, max_new, 128)
}

fn reference_with(prompt: &[u32], max_new: usize, max_len: usize) -> (String, usize) {
    let mut e = engine(1, max_len);
    let opts = GenerateOptions {
        max_new_tokens: max_new,
        sampling: SamplingParams::GREEDY,
        seed: 0,
        repetition_penalty: 1.0,
        stop_tokens: vec![258],
        keep_logits: false,
    };
    let g = generate(&mut e, prompt, &opts, |_| {}).unwrap();
    let tok = Tokenizer::open(&fixture()).unwrap();
    (tok.decode(&g.tokens).unwrap(), g.tokens.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_metrics() {
    let s = server(Opts::default());
    let app = s.router();
    let (st, _, body) = send(&app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ok"
    );
    let (st, _, body) = send(
        &app,
        Request::get("/v1/models").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], NAME);
    assert_eq!(v["data"][0]["max_model_len"], 128);
    // One request so the counters and histograms move.
    let (st, _) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 3, "temperature": 0}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, h, m) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(st, StatusCode::OK);
    assert!(h[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    for want in [
        "edgefit_requests_total{outcome=\"received\"} 1",
        "edgefit_requests_total{outcome=\"length\"} 1",
        "edgefit_generation_tokens_total 3",
        "edgefit_prompt_tokens_total 3",
        "edgefit_queue_depth 0",
        "edgefit_running_sequences 0",
        "edgefit_max_num_seqs 4",
        "edgefit_kv_cache_usage_ratio 0",
        "# TYPE edgefit_time_to_first_token_seconds histogram",
        "edgefit_time_to_first_token_seconds_count 1",
        "edgefit_inter_token_latency_seconds_count 2",
        "edgefit_inter_token_latency_seconds_bucket{le=\"+Inf\"} 2",
    ] {
        assert!(m.contains(want), "/metrics lacks {want:?}:\n{m}");
    }
    let (st, _, _) = send(&app, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_fed_over_several_steps_equals_generate() {
    // 600 prompt tokens: the server feeds them 256 per step beside the running sequences; `generate` feeds 512
    // then 88. The logits agree to ~1e-6 of their range, so greedy text is the same.
    let ids: Vec<u32> = (0..600u32).map(|i| (i * 37 + 11) % 256).collect();
    let (want, n) = reference_with(&ids, 12, 1024);
    let s = server(Opts {
        max_len: 1024,
        ..Opts::default()
    });
    let app = s.router();
    let (st, v) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["prompt_tokens"], 600);
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_completion_equals_generate() {
    let tok = Tokenizer::open(&fixture()).unwrap();
    let prompt = "The edge box says";
    let ids = tok.encode(prompt, true).unwrap();
    let (want, n) = reference(&ids, 24);
    let s = server(Opts::default());
    let app = s.router();
    let (st, v) = json_call(
        &app,
        "/v1/completions",
        &json!({"model": NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], ids.len() + n);
    let finish = if n < 24 { "stop" } else { "length" };
    assert_eq!(v["choices"][0]["finish_reason"], finish);
    // The same prompt as token ids.
    let (st, v2) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 24, "temperature": 0}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v2["choices"][0]["text"], want);

    // Chat: the template's rendering, tokenized without added special tokens, then the same greedy decode.
    let t = ChatTemplate::open(&fixture()).unwrap().unwrap();
    let chat_ids = tok
        .encode(&t.render_user("hi there").unwrap(), false)
        .unwrap();
    let (want, n) = reference(&chat_ids, 16);
    let (st, v) = json_call(
        &app,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi there"}], "max_completion_tokens": 16,
                "temperature": 0, "seed": 7}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want);
    assert_eq!(v["usage"]["prompt_tokens"], chat_ids.len());
    assert_eq!(v["usage"]["completion_tokens"], n);
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_match_whole_responses() {
    let s = server(Opts::default());
    let app = s.router();
    for (uri, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "stream me"}],
                   "max_tokens": 12, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "stream me", "max_tokens": 12, "temperature": 0}),
        ),
    ] {
        let chat = uri.contains("chat");
        let (st, whole) = json_call(&app, uri, &body).await;
        assert_eq!(st, StatusCode::OK);
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        sbody["stream_options"] = json!({"include_usage": true});
        let (st, h, text) = send(&app, post(uri, &sbody)).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], "text/event-stream");
        let data = sse_data(&text);
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let mut content = String::new();
        let mut finish = Vec::new();
        for c in &chunks[..chunks.len() - 1] {
            assert_eq!(
                c["object"],
                if chat {
                    "chat.completion.chunk"
                } else {
                    "text_completion"
                }
            );
            assert!(c["usage"].is_null());
            let ch = &c["choices"][0];
            if chat {
                content.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            } else {
                content.push_str(ch["text"].as_str().unwrap());
            }
            if !ch["finish_reason"].is_null() {
                finish.push(ch["finish_reason"].clone());
            }
        }
        if chat {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        }
        let want = if chat {
            &whole["choices"][0]["message"]["content"]
        } else {
            &whole["choices"][0]["text"]
        };
        assert_eq!(&Value::from(content), want);
        assert_eq!(finish, vec![whole["choices"][0]["finish_reason"].clone()]);
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], whole["usage"]);
    }
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_and_logprobs() {
    let s = server(Opts::default());
    let app = s.router();
    let (_, v) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 20, "temperature": 0}),
    )
    .await;
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string taken from the middle of the greedy text: the output ends right before it.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "{full:?}");
    let stop: String = chars[3..5].iter().collect();
    let cut = full.find(&stop).unwrap();
    let (st, v) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 20, "temperature": 0, "stop": [stop]}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["choices"][0]["text"], full[..cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Logprobs: one entry per token, the chosen one at least as likely as every listed alternative.
    let (st, v) = json_call(
        &app,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "temperature": 0,
                "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(
            (top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6,
            "greedy picks the top"
        );
    }
    let (st, v) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 4, "temperature": 0, "logprobs": 2}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["text_offset"][0], 0);
    // Sampling with a seed is reproducible.
    let body = json!({"prompt": "x", "max_tokens": 8, "temperature": 1.0, "top_k": 20, "seed": 11});
    let (_, a) = json_call(&app, "/v1/completions", &body).await;
    let (_, b) = json_call(&app, "/v1/completions", &body).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_400s_naming_the_field() {
    let s = server(Opts {
        max_len: 64,
        body: 4096,
        ..Opts::default()
    });
    let app = s.router();
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let cases: Vec<(&str, Value, StatusCode, &str, Option<&str>)> = vec![
        (
            "/v1/chat/completions",
            chat(json!({"frobnicate": 1})),
            StatusCode::BAD_REQUEST,
            "frobnicate",
            Some("frobnicate"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 2})),
            StatusCode::BAD_REQUEST,
            "`n` = 1",
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"presence_penalty": 0.5})),
            StatusCode::BAD_REQUEST,
            "presence_penalty",
            Some("presence_penalty"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": 3})),
            StatusCode::BAD_REQUEST,
            "temperature",
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 0})),
            StatusCode::BAD_REQUEST,
            "top_p",
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": "yes"})),
            StatusCode::BAD_REQUEST,
            "boolean",
            Some("stream"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream_options": {"include_usage": true}})),
            StatusCode::BAD_REQUEST,
            "stream",
            Some("stream_options"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 2})),
            StatusCode::BAD_REQUEST,
            "logprobs",
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 0})),
            StatusCode::BAD_REQUEST,
            "at least 1",
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 60})),
            StatusCode::BAD_REQUEST,
            "max_model_len 64",
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": "other"})),
            StatusCode::NOT_FOUND,
            "other",
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            StatusCode::BAD_REQUEST,
            "empty",
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "x"}]}),
            StatusCode::BAD_REQUEST,
            "role",
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"prompt": "x"}),
            StatusCode::BAD_REQUEST,
            "prompt",
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "messages": []}),
            StatusCode::BAD_REQUEST,
            "messages",
            Some("messages"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "echo": true}),
            StatusCode::BAD_REQUEST,
            "echo",
            Some("echo"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 9}),
            StatusCode::BAD_REQUEST,
            "logprobs",
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": ""}),
            StatusCode::BAD_REQUEST,
            "no tokens",
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 999999]}),
            StatusCode::BAD_REQUEST,
            "vocabulary",
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(64)}),
            StatusCode::BAD_REQUEST,
            "max_model_len is 64",
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 63}),
            StatusCode::BAD_REQUEST,
            "exceed max_model_len 64",
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": u64::MAX >> 1}),
            StatusCode::BAD_REQUEST,
            "exceed max_model_len 64",
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "stop": [1]}),
            StatusCode::BAD_REQUEST,
            "stop",
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!(["not", "an", "object"]),
            StatusCode::BAD_REQUEST,
            "JSON object",
            None,
        ),
    ];
    for (uri, body, status, needle, param) in cases {
        let (st, v) = json_call(&app, uri, &body).await;
        assert_eq!(st, status, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(needle),
            "{body}: {msg:?} should name {needle:?}"
        );
        assert_eq!(v["error"]["param"].as_str(), param, "{body}");
        assert!(v["error"]["type"].is_string());
    }
    // Malformed JSON: a 400 with the position.
    let req = Request::post("/v1/completions")
        .body(Body::from("{\"prompt\": \"hi\",\n \"max_tokens\": }"))
        .unwrap();
    let (st, _, text) = send(&app, req).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(text.contains("line 2 column"), "{text}");
    // Past the body limit: 413 before any parsing.
    let big = json!({"prompt": "y".repeat(8000)});
    let (st, _, _) = send(&app, post("/v1/completions", &big)).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
    // Wrong method.
    let (st, _, _) = send(
        &app,
        Request::get("/v1/completions").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
    // The server still answers after all that.
    let (st, _) = json_call(
        &app,
        "/v1/completions",
        &json!({"prompt": "ok", "max_tokens": 2}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set() {
    let s = server(Opts {
        key: Some("sekrit"),
        ..Opts::default()
    });
    let app = s.router();
    let body = json!({"prompt": "hi", "max_tokens": 2});
    let (st, h, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{text}");
    assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
    for bad in [
        "Bearer wrong",
        "Bearer sekri",
        "Bearer sekrit2",
        "sekrit",
        "Basic sekrit",
    ] {
        let mut req = post("/v1/completions", &body);
        req.headers_mut()
            .insert(header::AUTHORIZATION, bad.parse().unwrap());
        let (st, _, _) = send(&app, req).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{bad}");
    }
    let (st, _, _) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let mut req = post("/v1/completions", &body);
    req.headers_mut()
        .insert(header::AUTHORIZATION, "Bearer sekrit".parse().unwrap());
    let (st, _, text) = send(&app, req).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    s.stop();
}

/// Reads an SSE body until `n` data events have arrived.
async fn read_events(body: &mut axum::body::BodyDataStream, n: usize) -> Vec<String> {
    let mut buf = String::new();
    loop {
        let d = sse_data(&buf);
        if d.len() >= n {
            return d;
        }
        match body.next().await {
            Some(Ok(b)) => buf.push_str(&String::from_utf8_lossy(&b)),
            _ => return sse_data(&buf),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_429_and_disconnect_frees_the_slot() {
    // A must still be running when C arrives: the server generates whether or not a client reads its stream, and
    // the tiny fixture decodes a token in ~0.1 ms, so A gets thousands of tokens to go and no stop token.
    let s = server(Opts {
        slots: 1,
        max_queue: 1,
        max_len: 4096,
        stop_at_eos: false,
        ..Opts::default()
    });
    let app = s.router();
    let long =
        json!({"prompt": "a long one", "max_tokens": 4000, "temperature": 0, "stream": true});
    // A takes the only slot.
    let a = app
        .clone()
        .oneshot(post("/v1/completions", &long))
        .await
        .unwrap();
    let mut a_body = a.into_body().into_data_stream();
    assert_eq!(read_events(&mut a_body, 2).await.len(), 2);
    // B waits in the queue (its stream is open but silent).
    let b = app
        .clone()
        .oneshot(post("/v1/completions", &long))
        .await
        .unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    // C finds the queue full.
    let (st, h, text) = send(
        &app,
        post("/v1/completions", &json!({"prompt": "c", "max_tokens": 2})),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert_eq!(h[header::RETRY_AFTER], "1");
    // A and B hang up; the loop notices before its next step, and D runs.
    drop(a_body);
    drop(b);
    let mut tries = 0;
    let (st, v) = loop {
        let (st, v) = json_call(
            &app,
            "/v1/completions",
            &json!({"prompt": "d", "max_tokens": 3}),
        )
        .await;
        tries += 1;
        if st != StatusCode::TOO_MANY_REQUESTS || tries == 200 {
            break (st, v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, _, m) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(
        m.contains("edgefit_requests_total{outcome=\"cancelled\"} 2"),
        "{m}"
    );
    let full = m
        .lines()
        .find_map(|l| l.strip_prefix("edgefit_requests_total{outcome=\"queue_full\"} "))
        .and_then(|x| x.parse::<u64>().ok())
        .unwrap();
    assert_eq!(
        full, tries,
        "C and every retry of D before the queue emptied"
    );
    assert!(m.contains("edgefit_queue_depth 0"), "{m}");
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_equal_single_requests() {
    const N: usize = 10;
    let prompts: Vec<String> = (0..N)
        .map(|i| format!("request {i}: {}", "ab".repeat(i)))
        .collect();
    let tok = Tokenizer::open(&fixture()).unwrap();
    // The ones that hang up ask for more than they can get before they do, so they cannot finish first.
    let cancels = |i: usize| i % 3 == 1;
    let max_tokens = |i: usize| if cancels(i) { 90 } else { 8 + 3 * i };
    let refs: Vec<(String, usize)> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| reference(&tok.encode(p, true).unwrap(), max_tokens(i)))
        .collect();
    let s = server(Opts::default());
    let app = s.router();
    let mut tasks = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let app = app.clone();
        let body = json!({"prompt": p, "max_tokens": max_tokens(i), "temperature": 0, "stream": true,
                          "stream_options": {"include_usage": true}});
        tasks.push(tokio::spawn(async move {
            let r = app.oneshot(post("/v1/completions", &body)).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let mut b = r.into_body().into_data_stream();
            // Every third request hangs up after its second chunk.
            if cancels(i) {
                let got = read_events(&mut b, 2).await;
                assert_eq!(got.len(), 2);
                return None;
            }
            let data = read_events(&mut b, usize::MAX).await;
            Some(data)
        }));
    }
    let mut finished = 0;
    let mut ids = std::collections::HashSet::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let Some(data) = t.await.unwrap() else {
            continue;
        };
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "request {i}"
        );
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let id = chunks[0]["id"].as_str().unwrap().to_string();
        assert!(
            chunks.iter().all(|c| c["id"] == id.as_str()),
            "one id per stream"
        );
        assert!(ids.insert(id), "request {i}: a duplicated id");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(
            text, refs[i].0,
            "request {i}: batched greedy text differs from single"
        );
        assert_eq!(
            chunks.last().unwrap()["usage"]["completion_tokens"],
            refs[i].1,
            "request {i}"
        );
        finished += 1;
    }
    assert_eq!(finished, (0..N).filter(|&i| !cancels(i)).count());
    // Nothing left behind: every slot free, nothing queued, every request accounted for.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, _, m) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let count = |label: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with(&format!("edgefit_requests_total{{outcome=\"{label}\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|x| x.parse().ok())
            .unwrap()
    };
    assert_eq!(count("received"), N as u64);
    assert_eq!(count("stop") + count("length"), finished as u64);
    assert_eq!(count("cancelled"), (N - finished) as u64);
    assert!(m.contains("edgefit_running_sequences 0"), "{m}");
    assert!(
        m.contains("edgefit_kv_cache_pages{state=\"used\"} 0"),
        "{m}"
    );
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_running_streams() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = server(Opts::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let srv = tokio::spawn(engine::serve::serve_on(
        s,
        listener,
        Duration::from_secs(30),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let body = json!({"prompt": "shutdown", "max_tokens": 40, "temperature": 0, "stream": true})
        .to_string();
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut first = [0u8; 64];
    let n = c.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    stop_tx.send(()).unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut rest))
        .await
        .expect("the stream ends")
        .unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(
        text.contains("\"finish_reason\":\"length\"")
            || text.contains("\"finish_reason\":\"stop\""),
        "the running request finished: {text}"
    );
    assert!(!text.contains("\"error\""), "{text}");
    tokio::time::timeout(Duration::from_secs(30), srv)
        .await
        .expect("the server returns")
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_whole_request_frees_its_slot() {
    // Long enough (thousands of tokens, no stop token) that the poll below sees it running before it ends.
    let s = server(Opts {
        slots: 1,
        max_len: 4096,
        stop_at_eos: false,
        ..Opts::default()
    });
    let app = s.router();
    let metric = |m: &str, name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok()))
            .unwrap()
    };
    // A non-streamed request whose client goes away: hyper drops the handler's future, and with it the receiver.
    let long = app.clone().oneshot(post(
        "/v1/completions",
        &json!({"prompt": "long", "max_tokens": 4000, "temperature": 0}),
    ));
    let task = tokio::spawn(long);
    let mut running = 0.0;
    for _ in 0..200 {
        let (_, _, m) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
        running = metric(&m, "edgefit_running_sequences");
        if running == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(running, 1.0, "the request was running");
    task.abort();
    let (st, v) = tokio::time::timeout(
        Duration::from_secs(60),
        json_call(
            &app,
            "/v1/completions",
            &json!({"prompt": "next", "max_tokens": 2}),
        ),
    )
    .await
    .expect("the slot was freed");
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, _, m) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    // Each request ended exactly once; the first was cancelled unless it had reached a stop before the abort.
    let ended: f64 = ["cancelled", "stop", "length"]
        .iter()
        .map(|o| metric(&m, &format!("edgefit_requests_total{{outcome=\"{o}\"}}")))
        .sum();
    assert_eq!(ended, 2.0, "{m}");
    assert_eq!(metric(&m, "edgefit_running_sequences"), 0.0);
    s.stop();
}
