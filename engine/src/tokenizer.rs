//! The checkpoint's tokenizer (`tokenizer.json`, through the `tokenizers` crate built without its C++ regex) and
//! the stop tokens and sampling defaults of `generation_config.json`.

use std::path::Path;

use crate::EngineError;

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn open(dir: &Path) -> Result<Tokenizer, EngineError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| EngineError::Checkpoint(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner })
    }

    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, EngineError> {
        let enc = self
            .inner
            .encode(text, special)
            .map_err(|e| EngineError::Request(format!("tokenizing the prompt: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| EngineError::Request(format!("detokenizing: {e}")))
    }

    /// One token's text as it reads in a decoded string, special tokens included (for `logprobs`).
    pub fn token_text(&self, id: u32) -> String {
        self.inner.decode(&[id], false).unwrap_or_default()
    }

    /// The id of a token string, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Incremental detokenization: text is released only once it no longer ends in an incomplete character, decoding
/// a short window of earlier tokens for context (as TGI and vLLM do) instead of the whole sequence each step.
pub struct Detok {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    text: String,
    sent: usize,
}

impl Default for Detok {
    fn default() -> Detok {
        Detok::new()
    }
}

impl Detok {
    pub fn new() -> Detok {
        Detok {
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            text: String::new(),
            sent: 0,
        }
    }

    /// Adds token `id`; `last` releases an incomplete trailing character too.
    pub fn push(&mut self, tok: &Tokenizer, id: u32, last: bool) {
        self.ids.push(id);
        let before = tok
            .decode(&self.ids[self.prefix..self.read])
            .unwrap_or_default();
        let now = tok.decode(&self.ids[self.prefix..]).unwrap_or_default();
        if now.len() > before.len() && (last || !now.ends_with('\u{FFFD}')) {
            if let Some(d) = now.get(before.len()..) {
                self.text.push_str(d);
                self.prefix = self.read;
                self.read = self.ids.len();
            }
        }
    }

    /// Text not yet sent that can be sent: up to the first stop string (then `true`), else all but a suffix that
    /// could still become a stop string.
    pub fn release(&mut self, stops: &[String], last: bool) -> (String, bool) {
        let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|p| from + p))
            .min();
        if let Some(pos) = hit {
            let out = self.text.get(self.sent..pos).unwrap_or("").to_string();
            self.text.truncate(pos.max(self.sent));
            self.sent = self.text.len();
            return (out, true);
        }
        let mut end = self.text.len();
        if !last {
            let hold = stops
                .iter()
                .flat_map(|s| {
                    (1..s.len())
                        .filter(|&k| s.is_char_boundary(k) && self.text.ends_with(&s[..k]))
                        .max()
                })
                .max()
                .unwrap_or(0);
            end -= hold;
        }
        let end = end.max(self.sent);
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        (out, false)
    }
}

/// `generation_config.json`'s stop tokens and sampling defaults, when the file exists.
#[derive(Debug, Clone, Default)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// The stop tokens: `generation_config.json`'s, else the config's `eos_token_id`.
    pub fn stop_tokens(&self, spec: &planner::model::ModelSpec) -> Vec<u32> {
        if !self.eos_token_ids.is_empty() {
            return self.eos_token_ids.clone();
        }
        spec.runtime
            .eos_token_ids
            .iter()
            .filter_map(|&x| u32::try_from(x).ok())
            .collect()
    }

    pub fn open(dir: &Path) -> Result<GenerationConfig, EngineError> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(GenerationConfig::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| EngineError::io(&path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            EngineError::Checkpoint(format!(
                "{}:{}:{}: {e}",
                path.display(),
                e.line(),
                e.column()
            ))
        })?;
        let bad = |key: &str, want: &str| {
            EngineError::Checkpoint(format!("{}: `{key}` must be {want}", path.display()))
        };
        let eos = match v.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| bad("eos_token_id", "token ids"))
                })
                .collect::<Result<_, _>>()?,
            Some(x) => vec![x
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| bad("eos_token_id", "a token id or a list of them"))?],
        };
        let num = |key: &str| -> Result<Option<f64>, EngineError> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x.as_f64().map(Some).ok_or_else(|| bad(key, "a number")),
            }
        };
        Ok(GenerationConfig {
            eos_token_ids: eos,
            temperature: num("temperature")?.map(|x| x as f32),
            top_k: num("top_k")?.map(|x| x as usize),
            top_p: num("top_p")?.map(|x| x as f32),
            repetition_penalty: num("repetition_penalty")?.map(|x| x as f32),
        })
    }
}
