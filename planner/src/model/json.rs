//! A JSON tree that remembers where every key and value sits in the source text.
//!
//! `serde_json::Value` forgets positions, and a config error that cannot point at the offending key is an error the
//! user has to hunt for. So the text is first checked by `serde_json` (whose syntax errors carry a line and column,
//! turned into a byte span here), then parsed again by the small recursive-descent reader below, which keeps byte
//! spans. The reader never panics: every index is checked, recursion is bounded by [`MAX_DEPTH`], and anything it does
//! not expect becomes an error with a span.

use miette::SourceSpan;

/// Deepest nesting accepted. Real configs nest 3-4 levels; `serde_json` itself stops at 128.
const MAX_DEPTH: usize = 128;

/// One JSON value and the byte range of its text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) span: Span,
    pub(crate) kind: Kind,
}

/// Byte range `[start, end)` in the source text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl From<Span> for SourceSpan {
    fn from(s: Span) -> Self {
        SourceSpan::new(s.start.into(), s.end.saturating_sub(s.start))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Null,
    Bool(bool),
    /// The number's own text, so that integers are read exactly (no detour through `f64`).
    Number(String),
    String(String),
    Array(Vec<Node>),
    Object(Vec<Member>),
}

/// One `"key": value` pair of an object, with the span of the key itself (where a label points for a bad value's
/// key, or for an unknown key).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub(crate) key: String,
    pub(crate) key_span: Span,
    pub(crate) value: Node,
}

impl Node {
    pub(crate) fn get(&self, key: &str) -> Option<&Member> {
        match &self.kind {
            Kind::Object(members) => members.iter().find(|m| m.key == key),
            _ => None,
        }
    }

    /// A short name of the value's type, for "expected X, found Y" messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match &self.kind {
            Kind::Null => "null",
            Kind::Bool(_) => "a boolean",
            Kind::Number(_) => "a number",
            Kind::String(_) => "a string",
            Kind::Array(_) => "an array",
            Kind::Object(_) => "an object",
        }
    }
}

/// Why the text is not JSON, and where.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub(crate) message: String,
    pub(crate) span: Span,
}

/// Parses `text` into a spanned tree. Syntax errors come from `serde_json` (its messages are the ones users know),
/// located by converting its 1-based line and column into a byte offset.
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        let at = offset_of(text, e.line(), e.column());
        let message = strip_position(&e.to_string());
        return Err(SyntaxError {
            message,
            span: point_span(text, at),
        });
    }
    let mut r = Reader {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    r.skip_ws();
    let node = r.value(0)?;
    r.skip_ws();
    if r.pos != r.bytes.len() {
        return Err(r.error("trailing characters after the JSON value"));
    }
    Ok(node)
}

/// `serde_json` appends " at line L column C"; the span already says where, so the text need not.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// Byte offset of a 1-based (line, column) position, clamped to the text. `serde_json` reports column 0 when the
/// error sits at the start of a line (e.g. unexpected end of input after a newline).
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0usize;
    for _ in 1..line.max(1) {
        match text[start..].find('\n') {
            Some(i) => start += i + 1,
            None => return text.len(),
        }
    }
    let line_len = text[start..].find('\n').unwrap_or(text.len() - start);
    let col = column.saturating_sub(1).min(line_len);
    let mut at = start + col;
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// A one-character span at `at` (empty at the end of the text), on a character boundary.
fn point_span(text: &str, at: usize) -> Span {
    let mut at = at.min(text.len());
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    let end = text[at..].chars().next().map_or(at, |c| at + c.len_utf8());
    Span { start: at, end }
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn error(&self, message: &str) -> SyntaxError {
        SyntaxError {
            message: message.to_string(),
            span: point_span(self.text, self.pos),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, b: u8, what: &str) -> Result<(), SyntaxError> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        let start = self.pos;
        let kind = match self.peek() {
            Some(b'{') => self.object(depth)?,
            Some(b'[') => self.array(depth)?,
            Some(b'"') => Kind::String(self.string()?),
            Some(b't') => self.literal("true", Kind::Bool(true))?,
            Some(b'f') => self.literal("false", Kind::Bool(false))?,
            Some(b'n') => self.literal("null", Kind::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => return Err(self.error("expected a JSON value")),
        };
        Ok(Node {
            span: Span {
                start,
                end: self.pos,
            },
            kind,
        })
    }

    fn literal(&mut self, word: &str, kind: Kind) -> Result<Kind, SyntaxError> {
        if self.bytes.get(self.pos..self.pos + word.len()) == Some(word.as_bytes()) {
            self.pos += word.len();
            Ok(kind)
        } else {
            Err(self.error("expected a JSON value"))
        }
    }

    fn number(&mut self) -> Kind {
        let start = self.pos;
        while matches!(
            self.peek(),
            Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
        ) {
            self.pos += 1;
        }
        Kind::Number(
            self.text
                .get(start..self.pos)
                .unwrap_or_default()
                .to_string(),
        )
    }

    fn string(&mut self) -> Result<String, SyntaxError> {
        let start = self.pos;
        self.expect(b'"', "expected a string")?;
        // Find the closing quote, stepping over escapes; then let serde_json decode the escapes exactly.
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => self.pos += 2,
                Some(_) => self.pos += 1,
                None => return Err(self.error("unterminated string")),
            }
        }
        let raw = self
            .text
            .get(start..self.pos)
            .ok_or_else(|| self.error("invalid string"))?;
        serde_json::from_str::<String>(raw).map_err(|_| self.error("invalid string"))
    }

    fn array(&mut self, depth: usize) -> Result<Kind, SyntaxError> {
        self.expect(b'[', "expected `[`")?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Kind::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Kind::Array(items));
                }
                _ => return Err(self.error("expected `,` or `]`")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Kind, SyntaxError> {
        self.expect(b'{', "expected `{`")?;
        let mut members: Vec<Member> = Vec::new();
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Kind::Object(members));
        }
        loop {
            self.skip_ws();
            let key_start = self.pos;
            let key = self.string()?;
            let key_span = Span {
                start: key_start,
                end: self.pos,
            };
            self.skip_ws();
            self.expect(b':', "expected `:`")?;
            self.skip_ws();
            let value = self.value(depth + 1)?;
            // A repeated key keeps its last value, as Python's `json` and so Hugging Face do.
            match seen.get(&key) {
                Some(&i) => {
                    members[i] = Member {
                        key,
                        key_span,
                        value,
                    }
                }
                None => {
                    seen.insert(key.clone(), members.len());
                    members.push(Member {
                        key,
                        key_span,
                        value,
                    });
                }
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Kind::Object(members));
                }
                _ => return Err(self.error("expected `,` or `}`")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_point_at_keys_and_values() {
        let text = "{\n  \"a\": 12,\n  \"b\": [true, null, \"x\\n\"]\n}";
        let root = parse(text).unwrap();
        let a = root.get("a").unwrap();
        assert_eq!(&text[a.key_span.start..a.key_span.end], "\"a\"");
        assert_eq!(&text[a.value.span.start..a.value.span.end], "12");
        assert_eq!(a.value.kind, Kind::Number("12".into()));
        let b = root.get("b").unwrap();
        match &b.value.kind {
            Kind::Array(items) => {
                assert_eq!(items.len(), 3);
                assert_eq!(items[2].kind, Kind::String("x\n".into()));
            }
            other => panic!("expected an array, got {other:?}"),
        }
    }

    #[test]
    fn syntax_error_lands_on_serde_line_and_column() {
        // The missing comma is detected at the start of line 3 (the second key).
        let text = "{\n  \"a\": 1\n  \"b\": 2\n}";
        let err = parse(text).unwrap_err();
        let line = text[..err.span.start].matches('\n').count() + 1;
        assert_eq!(line, 3, "{err:?}");
        assert!(err.message.contains("expected `,`"), "{}", err.message);
        assert!(!err.message.contains("at line"), "{}", err.message);
    }

    #[test]
    fn offsets_are_clamped_and_on_char_boundaries() {
        assert_eq!(offset_of("ab", 9, 9), 2);
        assert_eq!(offset_of("aé", 1, 3), 1);
        assert_eq!(point_span("", 0), Span { start: 0, end: 0 });
        // Truncated input: the error sits at the end of the text, never past it.
        let err = parse("{\"a\": ").unwrap_err();
        assert!(err.span.end <= 6);
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_like_python() {
        let text = r#"{"vocab_size": 1, "x": 0, "vocab_size": 2}"#;
        let root = parse(text).unwrap();
        let m = root.get("vocab_size").unwrap();
        assert_eq!(m.value.kind, Kind::Number("2".into()));
        assert_eq!(&text[m.key_span.start..m.key_span.end], "\"vocab_size\"");
        assert!(m.key_span.start > 20, "the span points at the key that won");
        match &root.kind {
            Kind::Object(members) => assert_eq!(members.len(), 2, "one member per key"),
            other => panic!("expected an object, got {other:?}"),
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(&text).is_err());
    }
}
