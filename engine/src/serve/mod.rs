//! `edgefit serve`: the engine behind the OpenAI HTTP API, with continuous batching.
//!
//! [`Server::start`] takes a loaded [`Engine`], moves it onto its own OS thread (the step loop of [`scheduler`])
//! and returns the [`axum`] router; the HTTP side only parses, tokenizes, queues and streams, so it never blocks
//! a step. Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (streamed as server-sent events ending
//! with `data: [DONE]`, or whole), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text). Requests
//! past the slots wait in a bounded queue; past the queue they get 429 with `Retry-After`. [`serve`] binds,
//! serves, and shuts down gracefully on SIGTERM or ctrl-c: it stops accepting, lets running requests finish for a
//! grace period, cancels what is left, and returns.

pub(crate) mod api;
mod metrics;
pub(crate) mod scheduler;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kernels::sampling::SamplingParams;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::UnboundedReceiver;

use self::api::{ApiError, Head, Kind, Prompt};
use self::metrics::Shared;
use self::scheduler::{Event, Job, Msg};
use crate::chat::{ChatTemplate, RenderOptions};
use crate::tokenizer::{GenerationConfig, Tokenizer};
use crate::{Engine, EngineError};

/// `edgefit serve`'s own flags (the model, plan and profile flags are the CLI's common ones).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeFlags {
    /// Address to bind; loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name clients send and `/v1/models` lists (default: the checkpoint directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on every request (or set `EDGEFIT_API_KEY`, which keeps the key out of
    /// the process list).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sequences in the running batch when the engine makes the plan (a `--plan` carries its own).
    #[arg(long, default_value_t = 4)]
    pub max_num_seqs: u64,
    /// Requests that may wait for a slot; past it the server answers 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds running requests get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_s: u64,
}

/// What the server needs besides the engine.
pub struct ServeConfig {
    pub model_name: String,
    pub api_key: Option<String>,
    pub max_queue: usize,
    pub max_body_bytes: usize,
    /// End-of-sequence ids (`generation_config.json`, else the model config's).
    pub stop_tokens: Vec<u32>,
    /// Sampling defaults for fields a request leaves out.
    pub defaults: GenerationConfig,
}

impl ServeConfig {
    /// The configuration for the checkpoint in `dir`: its served name, stop tokens and sampling defaults.
    pub fn for_checkpoint(
        dir: &Path,
        engine: &Engine,
        flags: &ServeFlags,
    ) -> Result<ServeConfig, EngineError> {
        let defaults = GenerationConfig::open(dir)?;
        let stop_tokens = defaults.stop_tokens(&engine.model.spec);
        let model_name = flags.served_model_name.clone().unwrap_or_else(|| {
            dir.canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "model".into())
        });
        Ok(ServeConfig {
            model_name,
            api_key: flags
                .api_key
                .clone()
                .or_else(|| std::env::var("EDGEFIT_API_KEY").ok())
                .filter(|k| !k.is_empty()),
            max_queue: flags.max_queue,
            max_body_bytes: flags.max_body_bytes,
            stop_tokens,
            defaults,
        })
    }
}

struct App {
    tx: Mutex<mpsc::Sender<Msg>>,
    tok: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    cfg: ServeConfig,
    key_hash: Option<[u8; 32]>,
    shared: Arc<Shared>,
    max_len: usize,
    vocab: usize,
    draining: AtomicBool,
    next_id: AtomicU64,
    started: u64,
}

/// A running step loop and the router in front of it.
pub struct Server {
    app: Arc<App>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn sha(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Equality of two digests in time that does not depend on where they differ. Comparing digests rather than the
/// keys also keeps the key's length from showing in the timing.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut d = 0u8;
    for (x, y) in a.iter().zip(b) {
        d |= x ^ y;
    }
    std::hint::black_box(d) == 0
}

impl Server {
    /// Moves `engine` onto the step-loop thread.
    pub fn start(
        engine: Engine,
        tok: Tokenizer,
        template: Option<ChatTemplate>,
        cfg: ServeConfig,
    ) -> Result<Server, EngineError> {
        let shared = Arc::new(Shared::new(
            engine.caches.slots,
            engine.caches.pages,
            engine.caches.bytes,
        ));
        let tok = Arc::new(tok);
        let (tx, rx) = mpsc::channel();
        let max_len = engine.max_len;
        let vocab = engine.model.vocab();
        let thread = {
            let (tok, shared) = (tok.clone(), shared.clone());
            std::thread::Builder::new()
                .name("edgefit-engine".into())
                .spawn(move || scheduler::run(engine, tok, rx, shared))
                .map_err(|e| EngineError::Request(format!("starting the engine thread: {e}")))?
        };
        let key_hash = cfg.api_key.as_deref().map(sha);
        let app = Arc::new(App {
            tx: Mutex::new(tx),
            tok,
            template,
            key_hash,
            shared,
            max_len,
            vocab,
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            started: unix_now(),
            cfg,
        });
        Ok(Server {
            app,
            thread: Some(thread),
        })
    }

    /// The HTTP routes.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/metrics", get(prometheus))
            .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
            .layer(axum::middleware::from_fn_with_state(self.app.clone(), auth))
            .layer(DefaultBodyLimit::max(self.app.cfg.max_body_bytes))
            .with_state(self.app.clone())
    }

    /// Refuse new requests (503, and `/health` says 503); the accepted ones, running or queued, still finish.
    pub fn drain(&self) {
        self.app.draining.store(true, Ordering::SeqCst);
        self.send(Msg::Drain);
    }

    fn send(&self, m: Msg) {
        if let Ok(tx) = self.app.tx.lock() {
            let _ = tx.send(m);
        }
    }

    /// Cancels whatever still runs and waits for the step loop to end.
    pub fn stop(mut self) {
        self.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn auth(State(app): State<Arc<App>>, req: axum::extract::Request, next: Next) -> Response {
    if let Some(want) = &app.key_hash {
        let got = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !ct_eq(&sha(got), want) {
            let mut r = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key (Authorization: Bearer KEY)",
            )
            .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    }
    next.run(req).await
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [{
        "id": app.cfg.model_name, "object": "model", "created": app.started, "owned_by": "edgefit",
        "max_model_len": app.max_len,
    }]}))
    .into_response()
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.draining.load(Ordering::SeqCst) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "shutting down"})),
        )
            .into_response()
    } else {
        axum::Json(json!({"status": "ok"})).into_response()
    }
}

async fn prometheus(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.shared.render(),
    )
        .into_response()
}

async fn chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    handle(app, Kind::Chat, body).await
}

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    handle(app, Kind::Completion, body).await
}

/// The prompt's ids: the chat template rendered and tokenized without added special tokens (the template writes
/// them, as `apply_chat_template(tokenize=True)` does), or the completion prompt tokenized with them.
fn prompt_ids(app: &App, req: &api::Request, body: &[u8]) -> Result<Vec<u32>, ApiError> {
    let ids = match &req.prompt {
        Prompt::Text(t) => app
            .tok
            .encode(t, true)
            .map_err(|e| ApiError::bad("prompt", e.to_string()))?,
        Prompt::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= app.vocab) {
                return Err(ApiError::bad(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary ({})", app.vocab),
                ));
            }
            ids.clone()
        }
        Prompt::Messages => {
            let Some(t) = &app.template else {
                return Err(ApiError::bad(
                    "messages",
                    "this checkpoint has no chat template (tokenizer_config.json `chat_template`); use /v1/completions",
                ));
            };
            #[derive(serde::Deserialize)]
            struct Parts {
                messages: minijinja::Value,
                #[serde(default)]
                tools: Option<minijinja::Value>,
            }
            let p: Parts = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad("messages", e.to_string()))?;
            let text = t
                .render(
                    &p.messages,
                    &RenderOptions {
                        add_generation_prompt: true,
                        tools: p.tools.filter(|_| req.has_tools),
                        extra: Vec::new(),
                    },
                )
                .map_err(|e| ApiError::bad("messages", e.to_string()))?;
            app.tok
                .encode(&text, false)
                .map_err(|e| ApiError::bad("messages", e.to_string()))?
        }
    };
    if ids.is_empty() {
        let param = if req.prompt_is_chat() {
            "messages"
        } else {
            "prompt"
        };
        return Err(ApiError::bad(param, "the prompt has no tokens"));
    }
    Ok(ids)
}

impl api::Request {
    fn prompt_is_chat(&self) -> bool {
        matches!(self.prompt, Prompt::Messages)
    }
}

/// A checked, tokenized request ready to queue.
struct Prepared {
    job: Box<Job>,
    events: UnboundedReceiver<Event>,
    req: api::Request,
    head: Head,
}

/// Checks and tokenizes one request; the job and the head of its responses.
fn prepare(app: &App, kind: Kind, body: &[u8]) -> Result<Prepared, ApiError> {
    if app.draining.load(Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        ));
    }
    let req = api::parse(kind, body, &app.cfg.model_name)?;
    let prompt = prompt_ids(app, &req, body)?;
    let max_param = if kind == Kind::Chat {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    if prompt.len() >= app.max_len {
        return Err(ApiError::bad(
            if req.prompt_is_chat() {
                "messages"
            } else {
                "prompt"
            },
            format!(
                "the prompt has {} tokens; max_model_len is {}",
                prompt.len(),
                app.max_len
            ),
        ));
    }
    let max_tokens = req.max_tokens.unwrap_or(app.max_len - prompt.len());
    if prompt
        .len()
        .checked_add(max_tokens)
        .is_none_or(|n| n > app.max_len)
    {
        return Err(ApiError::bad(
            max_param,
            format!(
                "the prompt ({} tokens) + max_tokens ({max_tokens}) exceed max_model_len {}",
                prompt.len(),
                app.max_len
            ),
        ));
    }
    let d = &app.cfg.defaults;
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let seed = req.seed.unwrap_or_else(|| {
        // No seed asked: a different stream per request.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    });
    let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
    let job = Box::new(Job {
        max_tokens,
        sampling: SamplingParams {
            // OpenAI's default temperature is 1 unless the checkpoint says otherwise.
            temperature: req.temperature.or(d.temperature).unwrap_or(1.0),
            top_k: req.top_k.or(d.top_k).unwrap_or(0),
            top_p: req.top_p.or(d.top_p).unwrap_or(1.0),
        },
        seed,
        repetition_penalty: d.repetition_penalty.unwrap_or(1.0),
        stop_tokens: app.cfg.stop_tokens.clone(),
        stop_strings: req.stop.clone(),
        logprobs: req.logprobs,
        events: etx,
        submitted: Instant::now(),
        prompt,
    });
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    let head = Head {
        id: format!("{prefix}-{:x}{id:06x}", app.started),
        created: unix_now(),
        model: app.cfg.model_name.clone(),
        kind,
    };
    Ok(Prepared {
        job,
        events: erx,
        req,
        head,
    })
}

async fn handle(app: Arc<App>, kind: Kind, body: Bytes) -> Response {
    app.shared.metrics.received.fetch_add(1, Ordering::Relaxed);
    let Prepared {
        job,
        events: rx,
        req,
        head,
    } = match prepare(&app, kind, &body) {
        Ok(x) => x,
        Err(e) => {
            app.shared.metrics.invalid.fetch_add(1, Ordering::Relaxed);
            return e.into_response();
        }
    };
    // The bounded queue: a request counts as queued until the step loop gives it a slot.
    let before = app.shared.queued.fetch_add(1, Ordering::SeqCst);
    if before >= app.cfg.max_queue {
        app.shared.queued.fetch_sub(1, Ordering::SeqCst);
        app.shared
            .metrics
            .rejected_queue_full
            .fetch_add(1, Ordering::Relaxed);
        return ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the queue is full ({} requests waiting); retry later",
                    app.cfg.max_queue
                ),
            )
        }
        .into_response();
    }
    let sent = app
        .tx
        .lock()
        .map(|tx| tx.send(Msg::Submit(job)).is_ok())
        .unwrap_or(false);
    if !sent {
        app.shared.queued.fetch_sub(1, Ordering::SeqCst);
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped")
            .into_response();
    }
    if req.stream {
        stream(head, rx, req.include_usage).into_response()
    } else {
        whole(head, rx).await
    }
}

/// Waits for the whole completion. Dropping this future (the client went away) closes the event channel, which
/// frees the sequence at the next step.
async fn whole(head: Head, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    let mut lps = Vec::new();
    let mut want_lp = false;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Delta { text: t, tokens } => {
                want_lp |= !tokens.is_empty();
                text.push_str(&t);
                lps.extend(tokens);
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                let lp = want_lp.then(|| api::logprobs_json(head.kind, &lps, 0));
                return axum::Json(api::response(
                    &head,
                    &text,
                    lp,
                    Some(finish),
                    prompt_tokens,
                    completion_tokens,
                ))
                .into_response();
            }
            Event::Error { status, message } => {
                return ApiError::new(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    message,
                )
                .into_response()
            }
        }
    }
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the engine dropped the request",
    )
    .into_response()
}

struct StreamState {
    head: Head,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    out: VecDeque<SseEvent>,
    first: bool,
    done: bool,
    offset: usize,
}

fn data(v: &serde_json::Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// Server-sent events: one chunk per delta, the finish reason, the usage when asked, then `[DONE]`. When the
/// client disconnects, hyper drops this stream and with it the receiver, which frees the sequence at the next
/// step.
fn stream(
    head: Head,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let st = StreamState {
        head,
        rx,
        include_usage,
        out: VecDeque::new(),
        first: true,
        done: false,
        offset: 0,
    };
    let s = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(e) = st.out.pop_front() {
                return Some((Ok(e), st));
            }
            if st.done {
                return None;
            }
            let h = &st.head;
            if st.first && h.kind == Kind::Chat {
                st.first = false;
                st.out.push_back(data(&api::chunk(
                    h,
                    Some(""),
                    true,
                    None,
                    None,
                    st.include_usage,
                )));
                continue;
            }
            match st.rx.recv().await {
                Some(Event::Delta { text, tokens }) => {
                    if text.is_empty() && tokens.is_empty() {
                        continue;
                    }
                    let lp = (!tokens.is_empty())
                        .then(|| api::logprobs_json(h.kind, &tokens, st.offset));
                    st.offset += text.len();
                    st.out.push_back(data(&api::chunk(
                        h,
                        Some(&text),
                        false,
                        lp,
                        None,
                        st.include_usage,
                    )));
                }
                Some(Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let text = (h.kind == Kind::Completion).then_some("");
                    st.out.push_back(data(&api::chunk(
                        h,
                        text,
                        false,
                        None,
                        Some(finish),
                        st.include_usage,
                    )));
                    if st.include_usage {
                        st.out.push_back(data(&api::usage_chunk(
                            h,
                            prompt_tokens,
                            completion_tokens,
                        )));
                    }
                    st.out.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
                Some(Event::Error { status, message }) => {
                    let e = ApiError::new(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        message,
                    );
                    st.out.push_back(data(&e.body()));
                    st.out.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the engine dropped the request",
                    );
                    st.out.push_back(data(&e.body()));
                    st.done = true;
                }
            }
        }
    });
    Sse::new(s).keep_alive(KeepAlive::default())
}

/// Serves on `listener` until `shutdown` completes, then shuts down gracefully: stop accepting, let the accepted
/// requests (running or queued) finish for `grace`, cancel the rest, stop the step loop.
pub async fn serve_on(
    server: Server,
    listener: tokio::net::TcpListener,
    grace: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let server = Arc::new(server);
    let (fired_tx, fired_rx) = tokio::sync::watch::channel(false);
    let signal = {
        let server = server.clone();
        async move {
            shutdown.await;
            server.drain();
            let _ = fired_tx.send(true);
        }
    };
    // After the grace period, cancel what still runs so its streams end and the connections close.
    let canceller = {
        let server = server.clone();
        let mut fired_rx = fired_rx.clone();
        tokio::spawn(async move {
            while !*fired_rx.borrow() {
                if fired_rx.changed().await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(grace).await;
            server.send(Msg::Stop);
        })
    };
    let r = axum::serve(listener, server.router())
        .with_graceful_shutdown(signal)
        .await;
    canceller.abort();
    let _ = canceller.await;
    if let Ok(s) = Arc::try_unwrap(server) {
        tokio::task::spawn_blocking(move || s.stop())
            .await
            .map_err(std::io::Error::other)?;
    }
    r
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// `edgefit serve` after the engine is loaded: tokenizer, chat template, the step loop, and the HTTP server on a
/// tokio runtime; returns once shut down.
pub fn run(engine: Engine, dir: &Path, flags: &ServeFlags) -> Result<(), EngineError> {
    let tok = Tokenizer::open(dir)?;
    let template = ChatTemplate::open(dir)?;
    let cfg = ServeConfig::for_checkpoint(dir, &engine, flags)?;
    let name = cfg.model_name.clone();
    let has_template = template.is_some();
    let server = Server::start(engine, tok, template, cfg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| EngineError::Request(format!("starting tokio: {e}")))?;
    let grace = Duration::from_secs(flags.shutdown_grace_s);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((flags.host.as_str(), flags.port)).await?;
        eprintln!(
            "serving {name} on http://{} (chat template: {})",
            listener.local_addr()?,
            if has_template { "yes" } else { "none" }
        );
        serve_on(server, listener, grace, shutdown_signal()).await
    })
    .map_err(|e| EngineError::Request(format!("serving on {}:{}: {e}", flags.host, flags.port)))?;
    eprintln!("shut down");
    Ok(())
}
