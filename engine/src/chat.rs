//! Chat templates: the checkpoint's `chat_template` (from `tokenizer_config.json`, or `chat_template.jinja` beside
//! it) rendered the way transformers' `apply_chat_template` renders it, so a prompt built here tokenizes to the same
//! ids as one built in Python. Load one with [`ChatTemplate::open`] and call [`ChatTemplate::render`] with the
//! OpenAI-shaped `messages` (and `tools`).
//!
//! What transformers sets up and this mirrors: Jinja with `trim_blocks` and `lstrip_blocks` on and the loop
//! controls (`break`/`continue`); a `tojson` that is Python's `json.dumps` (no HTML escaping, `ensure_ascii=False`,
//! `indent`, `separators`, `sort_keys`); the globals `raise_exception`, `strftime_now` and `dict`; the tokenizer's
//! special tokens (`bos_token`, `eos_token`, ...) as variables; Python's string/dict/list methods (`.strip()`,
//! `.split()`, `.items()`, ...) through minijinja-contrib's `pycompat`. Maps keep their insertion order, as Python
//! dicts do, so `tools | tojson` prints the keys in the order the client sent them.

use std::path::Path;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::EngineError;

/// A compiled chat template with the special tokens it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The named templates (`default`, `tool_use`, ...); a plain string template is `default`.
    names: Vec<String>,
    /// `bos_token`, `eos_token`, ... as `tokenizer_config.json` names them.
    special: Vec<(String, String)>,
}

/// What to render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, so the model writes the reply.
    pub add_generation_prompt: bool,
    /// OpenAI tool definitions, passed to the template as `tools` (`none` when absent).
    pub tools: Option<Value>,
    /// Further template variables (`enable_thinking`, `date_string`, ...), as `apply_chat_template`'s kwargs.
    pub extra: Vec<(String, Value)>,
}

fn terr(e: Error) -> EngineError {
    // The chain carries the template's line; `raise_exception`'s message is the detail.
    let mut msg = match e.detail() {
        Some(d) if e.kind() == ErrorKind::InvalidOperation => d.to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        if e.kind() != ErrorKind::InvalidOperation {
            msg = format!("{msg} (template line {line})");
        }
    }
    EngineError::Request(format!("chat template: {msg}"))
}

impl ChatTemplate {
    /// The template of the checkpoint in `dir`: `chat_template.jinja` when present (transformers 5 writes it
    /// there), else `tokenizer_config.json`'s `chat_template`. `Ok(None)` when the checkpoint has none.
    pub fn open(dir: &Path) -> Result<Option<ChatTemplate>, EngineError> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = if cfg_path.exists() {
            let text =
                std::fs::read_to_string(&cfg_path).map_err(|e| EngineError::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|e| {
                EngineError::Checkpoint(format!(
                    "{}:{}:{}: {e}",
                    cfg_path.display(),
                    e.line(),
                    e.column()
                ))
            })?
        } else {
            serde_json::Value::Null
        };
        let special: Vec<(String, String)> = [
            "bos_token",
            "eos_token",
            "unk_token",
            "pad_token",
            "sep_token",
            "cls_token",
            "mask_token",
        ]
        .iter()
        .filter_map(|k| {
            let v = cfg.get(*k)?;
            // A token is a string or an AddedToken object with its `content`.
            let s = v
                .as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            Some((k.to_string(), s.to_string()))
        })
        .collect();
        let jinja = dir.join("chat_template.jinja");
        let templates: Vec<(String, String)> = if jinja.exists() {
            let t = std::fs::read_to_string(&jinja).map_err(|e| EngineError::io(&jinja, e))?;
            vec![("default".into(), t)]
        } else {
            match cfg.get("chat_template") {
                None | Some(serde_json::Value::Null) => return Ok(None),
                Some(serde_json::Value::String(s)) => vec![("default".into(), s.clone())],
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .map(|t| {
                        let name = t.get("name").and_then(|n| n.as_str());
                        let tpl = t.get("template").and_then(|n| n.as_str());
                        match (name, tpl) {
                            (Some(n), Some(t)) => Ok((n.to_string(), t.to_string())),
                            _ => Err(EngineError::Checkpoint(format!(
                                "{}: each `chat_template` entry needs `name` and `template`",
                                cfg_path.display()
                            ))),
                        }
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => {
                    return Err(EngineError::Checkpoint(format!(
                        "{}: `chat_template` must be a string or a list of named templates",
                        cfg_path.display()
                    )))
                }
            }
        };
        ChatTemplate::new(templates, special).map(Some)
    }

    /// Compiles named templates (`[("default", source)]` for the usual single one).
    pub fn new(
        templates: Vec<(String, String)>,
        special: Vec<(String, String)>,
    ) -> Result<ChatTemplate, EngineError> {
        let mut env = Environment::new();
        // As transformers' ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_function("dict", dict);
        let mut names = Vec::new();
        for (name, source) in templates {
            env.add_template_owned(name.clone(), source)
                .map_err(|e| EngineError::Checkpoint(format!("chat template {name}: {e}")))?;
            names.push(name);
        }
        if names.is_empty() {
            return Err(EngineError::Checkpoint("no chat template".into()));
        }
        Ok(ChatTemplate {
            env,
            names,
            special,
        })
    }

    /// Renders `messages` (a list of `{role, content, ...}` maps). With tools, a template named `tool_use` is
    /// preferred when the checkpoint has one, as transformers does.
    pub fn render(&self, messages: &Value, opts: &RenderOptions) -> Result<String, EngineError> {
        let has = |n: &str| self.names.iter().any(|x| x == n);
        let name = if opts.tools.is_some() && has("tool_use") {
            "tool_use"
        } else if has("default") {
            "default"
        } else {
            self.names[0].as_str()
        };
        let tmpl = self.env.get_template(name).map_err(terr)?;
        let mut ctx: Vec<(String, Value)> = self
            .special
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        ctx.extend(opts.extra.iter().cloned());
        ctx.push(("messages".into(), messages.clone()));
        ctx.push((
            "tools".into(),
            opts.tools.clone().unwrap_or(Value::from(())),
        ));
        ctx.push(("documents".into(), Value::from(())));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        ));
        let ctx: Value = ctx.into_iter().collect();
        tmpl.render(ctx).map_err(terr)
    }

    /// One user message `{role: "user", content: text}` rendered with the generation prompt: `--chat`.
    pub fn render_user(&self, text: &str) -> Result<String, EngineError> {
        let msg: Value = [
            ("role", Value::from("user")),
            ("content", Value::from(text)),
        ]
        .into_iter()
        .collect();
        self.render(
            &Value::from(vec![msg]),
            &RenderOptions {
                add_generation_prompt: true,
                ..RenderOptions::default()
            },
        )
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `dict(**kwargs)` as transformers exposes it.
fn dict(args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut out: Vec<(Value, Value)> = Vec::new();
    for a in args.iter() {
        if a.kind() == ValueKind::Map {
            for k in a.try_iter()? {
                let v = a.get_item(&k)?;
                out.push((k, v));
            }
        }
    }
    for k in kwargs.args() {
        out.push((Value::from(k), kwargs.get::<Value>(k)?));
    }
    Ok(out.into_iter().collect())
}

/// `strftime_now(fmt)`: the local clock (this process reads the time as UTC) formatted with Python's `strftime`
/// directives.
fn strftime_now(fmt: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(secs, &fmt)))
}

/// Days since 1970-01-01 to (year, month 1-12, day 1-31): Howard Hinnant's civil-from-days.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Python's `strftime` for the directives chat templates use (`%d %b %B %Y %y %m %H %M %S %I %p %A %a %j %e %%`),
/// in the C locale; an unknown directive is kept as written.
pub fn strftime(unix_secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let (h, min, s) = (sod / 3600, (sod / 60) % 60, sod % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let wd = (days + 3).rem_euclid(7) as usize;
    let yday = days - {
        let mut jan1 = days - i64::from(d) + 1;
        for mm in 1..m {
            jan1 -= i64::from(days_in_month(y, mm));
        }
        jan1
    } + 1;
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(k) = it.next() else {
            out.push('%');
            break;
        };
        let month = MONTHS[(m - 1) as usize];
        match k {
            'd' => out.push_str(&format!("{d:02}")),
            'e' => out.push_str(&format!("{d:2}")),
            'm' => out.push_str(&format!("{m:02}")),
            'Y' => out.push_str(&y.to_string()),
            'y' => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            'b' | 'h' => out.push_str(&month[..3]),
            'B' => out.push_str(month),
            'A' => out.push_str(DAYS[wd]),
            'a' => out.push_str(&DAYS[wd][..3]),
            'H' => out.push_str(&format!("{h:02}")),
            'I' => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            'p' => out.push_str(if h < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{min:02}")),
            'S' => out.push_str(&format!("{s:02}")),
            'j' => out.push_str(&format!("{yday:03}")),
            '%' => out.push('%'),
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<Value> = s.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => (
                    a.as_str().unwrap_or(",").to_string(),
                    b.as_str().unwrap_or(":").to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair",
                    ))
                }
            }
        }
        // Python's defaults: ", " without indent, "," with it.
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out)?;
    // Safe: the JSON is text, never markup to escape.
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn json_str(s: &str, ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it (`1.0`, `1e+16`, `1.5e-07`).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust's `{:e}` is the shortest round-trip mantissa, as Python's repr; only the exponent differs.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

fn newline(o: &JsonOpts, level: usize, out: &mut String) {
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_json(v: &Value, o: &JsonOpts, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f: f64 = v.clone().try_into()?;
                out.push_str(&py_float(f));
            }
        }
        ValueKind::String => json_str(v.as_str().unwrap_or(""), o.ensure_ascii, out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if o.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(o, level + 1, out);
                let ks = match k.as_str() {
                    Some(s) => s.to_string(),
                    None => {
                        let mut t = String::new();
                        write_json(k, o, level + 1, &mut t)?;
                        t
                    }
                };
                json_str(&ks, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                write_json(&v.get_item(k)?, o, level + 1, out)?;
            }
            newline(o, level, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(o, level + 1, out);
                write_json(x, o, level + 1, out)?;
            }
            newline(o, level, out);
            out.push(']');
        }
        _ => json_str(&v.to_string(), o.ensure_ascii, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // datetime.utcfromtimestamp(1721952000 + 13*3600 + 5*60 + 9).strftime(...) in Python 3.
        let t = 1_721_952_000 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(
            strftime(t, "%d %b %Y|%A %a %B|%H:%M:%S %I%p|%j %y %m|%%"),
            "26 Jul 2024|Friday Fri July|13:05:09 01PM|208 24 07|%"
        );
        assert_eq!(strftime(0, "%d %b %Y %A"), "01 Jan 1970 Thursday");
        assert_eq!(strftime(951_782_400, "%Y-%m-%d %j"), "2000-02-29 060");
    }

    #[test]
    fn python_floats() {
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1.5), "1.5");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
        assert_eq!(py_float(0.0001), "0.0001");
    }
}
