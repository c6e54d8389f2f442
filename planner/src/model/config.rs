//! Typed, span-aware reads from a parsed `config.json` (or `hf_quant_config.json`).
//!
//! Every read names the dotted path of the field (`text_config.num_hidden_layers`) and, when it fails, points the
//! error at the key or value in the file the user has open. Architecture files read fields only through here, so no
//! field can be misread silently.

use std::sync::Arc;

use miette::NamedSource;

use super::error::ModelError;
use super::json::{self, Kind, Node, Span};
use super::SourceFile;

/// Bounds that keep a hostile or mistyped config from asking for absurd allocations: the inventory holds one entry
/// per tensor, so a `num_hidden_layers` of 10^12 must be an error, not an out-of-memory abort. The largest real
/// values today are ~100 layers and 512 experts.
pub(crate) const MAX_LAYERS: u64 = 4096;
pub(crate) const MAX_EXPERTS: u64 = 4096;
/// Bound on `layers x experts` (each expert is three inventory entries); the largest real MoE is ~25k.
pub(crate) const MAX_EXPERT_INSTANCES: u64 = 131_072;

/// One parsed JSON file with its source, so errors can quote it.
#[derive(Debug)]
pub(crate) struct Doc<'a> {
    pub(crate) file: &'a SourceFile,
    pub(crate) root: Node,
}

impl<'a> Doc<'a> {
    pub(crate) fn parse(file: &'a SourceFile) -> Result<Self, ModelError> {
        match json::parse(&file.text) {
            Ok(root) => {
                let doc = Doc { file, root };
                if !matches!(doc.root.kind, Kind::Object(_)) {
                    return Err(doc.wrong_type("(top level)", doc.root.span, "a JSON object"));
                }
                Ok(doc)
            }
            Err(e) => Err(ModelError::Syntax {
                message: e.message,
                src: named(file),
                span: e.span.into(),
            }),
        }
    }

    pub(crate) fn root(&self) -> Obj<'_> {
        Obj {
            doc: self,
            node: &self.root,
            path: String::new(),
        }
    }

    pub(crate) fn src(&self) -> Arc<NamedSource<String>> {
        named(self.file)
    }

    pub(crate) fn wrong_type(&self, field: &str, span: Span, expected: &str) -> ModelError {
        ModelError::WrongType {
            field: field.to_string(),
            expected: expected.to_string(),
            src: self.src(),
            span: span.into(),
        }
    }

    pub(crate) fn invalid(&self, field: &str, span: Span, expected: &str) -> ModelError {
        ModelError::InvalidValue {
            field: field.to_string(),
            expected: expected.to_string(),
            src: self.src(),
            span: span.into(),
        }
    }

    pub(crate) fn inconsistent(&self, field: &str, span: Span, reason: String) -> ModelError {
        ModelError::Inconsistent {
            field: field.to_string(),
            reason,
            src: self.src(),
            span: span.into(),
        }
    }

    pub(crate) fn quantization(&self, span: Span, reason: String) -> ModelError {
        ModelError::Quantization {
            reason,
            src: self.src(),
            span: span.into(),
        }
    }
}

fn named(file: &SourceFile) -> Arc<NamedSource<String>> {
    Arc::new(NamedSource::new(file.path.clone(), file.text.clone()))
}

/// A JSON object inside a [`Doc`], with the dotted path that leads to it.
#[derive(Debug, Clone)]
pub(crate) struct Obj<'a> {
    pub(crate) doc: &'a Doc<'a>,
    pub(crate) node: &'a Node,
    pub(crate) path: String,
}

/// A present, non-null field: its value node, the span of its key, and its full dotted name.
#[derive(Debug, Clone)]
pub(crate) struct Field<'a> {
    pub(crate) doc: &'a Doc<'a>,
    pub(crate) name: String,
    pub(crate) node: &'a Node,
    /// Span of the field's key (`None` for array elements).
    pub(crate) key_span: Option<Span>,
}

impl<'a> Obj<'a> {
    fn full(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The span of this object's opening brace line: where a "missing field" label points.
    pub(crate) fn head_span(&self) -> Span {
        Span {
            start: self.node.span.start,
            end: self
                .node
                .span
                .start
                .saturating_add(1)
                .min(self.node.span.end),
        }
    }

    /// The field if present and not `null` (Hugging Face configs write `null` for "not set").
    pub(crate) fn field(&self, key: &str) -> Option<Field<'a>> {
        let m = self.node.get(key)?;
        if m.value.kind == Kind::Null {
            return None;
        }
        Some(Field {
            doc: self.doc,
            name: self.full(key),
            node: &m.value,
            key_span: Some(m.key_span),
        })
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.field(key).is_some()
    }

    pub(crate) fn require(&self, key: &str) -> Result<Field<'a>, ModelError> {
        self.field(key).ok_or_else(|| ModelError::MissingField {
            field: self.full(key),
            src: self.doc.src(),
            span: self.head_span().into(),
        })
    }

    /// A required size or count, at least 1.
    pub(crate) fn count(&self, key: &str) -> Result<u64, ModelError> {
        self.require(key)?.count()
    }

    pub(crate) fn count_or(&self, key: &str, default: u64) -> Result<u64, ModelError> {
        self.field(key).map_or(Ok(default), |f| f.count())
    }

    pub(crate) fn opt_count(&self, key: &str) -> Result<Option<u64>, ModelError> {
        self.field(key).map(|f| f.count()).transpose()
    }

    /// An optional integer that may be 0 (e.g. `mtp_num_hidden_layers`).
    pub(crate) fn u64_or(&self, key: &str, default: u64) -> Result<u64, ModelError> {
        self.field(key).map_or(Ok(default), |f| f.u64())
    }

    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        self.field(key).map_or(Ok(default), |f| f.f64())
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        self.field(key).map_or(Ok(default), |f| f.bool())
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ModelError> {
        self.field(key).map(|f| f.str()).transpose()
    }

    pub(crate) fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>, ModelError> {
        self.field(key).map(|f| f.obj()).transpose()
    }
}

impl<'a> Field<'a> {
    /// Where a label about this field points: the value itself when it is a scalar, the key when the value is an
    /// array or object (a label spanning 60 lines of `layer_types` helps nobody).
    pub(crate) fn span(&self) -> Span {
        match (&self.node.kind, self.key_span) {
            (Kind::Array(_) | Kind::Object(_), Some(k)) => k,
            _ => self.node.span,
        }
    }

    fn wrong(&self, expected: &str) -> ModelError {
        self.doc.wrong_type(
            &self.name,
            self.span(),
            &format!("{expected}, found {}", self.node.type_name()),
        )
    }

    /// A non-negative integer. Accepts `4096` and `4096.0`-style integral numbers; rejects fractions and negatives.
    pub(crate) fn u64(&self) -> Result<u64, ModelError> {
        let Kind::Number(raw) = &self.node.kind else {
            return Err(self.wrong("a non-negative integer"));
        };
        if let Ok(v) = raw.parse::<u64>() {
            return Ok(v);
        }
        match raw.parse::<f64>() {
            Ok(v) if v < 0.0 => {
                Err(self
                    .doc
                    .invalid(&self.name, self.node.span, "a non-negative integer"))
            }
            Ok(v) if v.fract() == 0.0 && v <= 9.007_199_254_740_992e15 => Ok(v as u64),
            _ => Err(self
                .doc
                .invalid(&self.name, self.node.span, "a whole number")),
        }
    }

    /// A size or count that must be at least 1.
    pub(crate) fn count(&self) -> Result<u64, ModelError> {
        match self.u64()? {
            0 => Err(self
                .doc
                .invalid(&self.name, self.node.span, "a positive integer")),
            v => Ok(v),
        }
    }

    /// A finite number.
    pub(crate) fn f64(&self) -> Result<f64, ModelError> {
        let Kind::Number(raw) = &self.node.kind else {
            return Err(self.wrong("a number"));
        };
        match raw.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(self
                .doc
                .invalid(&self.name, self.node.span, "a finite number")),
        }
    }

    pub(crate) fn bool(&self) -> Result<bool, ModelError> {
        match self.node.kind {
            Kind::Bool(b) => Ok(b),
            _ => Err(self.wrong("true or false")),
        }
    }

    pub(crate) fn str(&self) -> Result<&'a str, ModelError> {
        match &self.node.kind {
            Kind::String(s) => Ok(s),
            _ => Err(self.wrong("a string")),
        }
    }

    pub(crate) fn obj(&self) -> Result<Obj<'a>, ModelError> {
        match &self.node.kind {
            Kind::Object(_) => Ok(Obj {
                doc: self.doc,
                node: self.node,
                path: self.name.clone(),
            }),
            _ => Err(self.wrong("an object")),
        }
    }

    /// The elements of an array, each as a field named `path[i]`.
    pub(crate) fn items(&self) -> Result<Vec<Field<'a>>, ModelError> {
        match &self.node.kind {
            Kind::Array(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, node)| Field {
                    doc: self.doc,
                    name: format!("{}[{i}]", self.name),
                    node,
                    key_span: None,
                })
                .collect()),
            _ => Err(self.wrong("an array")),
        }
    }

    /// An array of strings.
    pub(crate) fn strings(&self) -> Result<Vec<String>, ModelError> {
        self.items()?
            .iter()
            .map(|f| f.str().map(str::to_string))
            .collect()
    }

    pub(crate) fn invalid(&self, expected: &str) -> ModelError {
        self.doc.invalid(&self.name, self.span(), expected)
    }

    pub(crate) fn inconsistent(&self, reason: String) -> ModelError {
        self.doc.inconsistent(&self.name, self.span(), reason)
    }
}
