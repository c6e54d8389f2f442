//! Errors of the model side: every one names the file, points at the key or value that is wrong, and says what was
//! expected, so a user fixing a model card never has to guess where to look.

use std::sync::Arc;

use miette::{Diagnostic, NamedSource, SourceSpan};

/// Why a model card could not be turned into a [`super::ModelSpec`]. The source is shared (`Arc`) so the error
/// stays small to return and cheap to clone.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum ModelError {
    /// The file is not JSON at all.
    #[error("invalid JSON: {message}")]
    #[diagnostic(code(edgefit::model::syntax))]
    Syntax {
        message: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("here")]
        span: SourceSpan,
    },

    /// Neither the architecture nor the `model_type` is one the planner knows.
    #[error("unsupported model `{found}`")]
    #[diagnostic(
        code(edgefit::model::unsupported),
        help("supported architectures: {supported}")
    )]
    Unsupported {
        found: String,
        supported: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("not a supported architecture or model_type")]
        span: SourceSpan,
    },

    /// A field the architecture needs is absent.
    #[error("missing required field `{field}`")]
    #[diagnostic(code(edgefit::model::missing_field))]
    MissingField {
        field: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("this object has no `{field}`")]
        span: SourceSpan,
    },

    /// A field holds the wrong kind of value (a string where a count was expected, ...).
    #[error("`{field}` has the wrong type")]
    #[diagnostic(code(edgefit::model::wrong_type))]
    WrongType {
        field: String,
        expected: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("expected {expected}")]
        span: SourceSpan,
    },

    /// A field has the right type but an impossible value (zero heads, a negative size).
    #[error("`{field}` is invalid")]
    #[diagnostic(code(edgefit::model::invalid_value))]
    InvalidValue {
        field: String,
        expected: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("expected {expected}")]
        span: SourceSpan,
    },

    /// Fields that are each valid but disagree (layer_types length vs num_hidden_layers, heads that do not divide).
    #[error("inconsistent config: `{field}` {reason}")]
    #[diagnostic(code(edgefit::model::inconsistent))]
    Inconsistent {
        field: String,
        reason: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("{reason}")]
        span: SourceSpan,
    },

    /// The quantization metadata names a method or layout the planner does not model.
    #[error("unsupported quantization: {reason}")]
    #[diagnostic(code(edgefit::model::quantization))]
    Quantization {
        reason: String,
        #[source_code]
        src: Arc<NamedSource<String>>,
        #[label("{reason}")]
        span: SourceSpan,
    },
}
