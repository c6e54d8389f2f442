//! Errors of the device side of the planner. An input error always carries the file it came from and, where the
//! input has one, the span of the offending key or value, so the rendered report points at the line to fix.

use miette::{Diagnostic, NamedSource, SourceSpan};

/// A device profile (or another TOML input of the planner, such as a plan read back) that could not be accepted.
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("{message}")]
#[diagnostic(code(edgefit::profile))]
pub struct InputError {
    /// What is wrong, without repeating the file name (the snippet header shows it).
    pub message: String,
    #[source_code]
    pub src: NamedSource<String>,
    #[label("{label}")]
    pub span: Option<SourceSpan>,
    /// Short text under the span: what was expected there.
    pub label: String,
    #[help]
    pub help: Option<String>,
}

impl InputError {
    pub(crate) fn new(path: &str, text: &str, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            src: NamedSource::new(path, text.to_owned()),
            span: None,
            label: String::new(),
            help: None,
        }
    }

    pub(crate) fn at(
        mut self,
        span: Option<std::ops::Range<usize>>,
        label: impl Into<String>,
    ) -> Self {
        self.span = span.map(|r| SourceSpan::from(r.start..r.end.max(r.start)));
        self.label = label.into();
        self
    }

    /// Line (1-based) the error points at, for callers that print a one-line summary.
    pub fn line(&self) -> Option<usize> {
        let span = self.span?;
        let text = self.src.inner();
        let end = span.offset().min(text.len());
        Some(text[..end].bytes().filter(|&b| b == b'\n').count() + 1)
    }
}

/// Why planning failed before a verdict could be given (bad inputs). A plan that does not fit is not an error: it is
/// a plan with `verdict = "does-not-fit"`.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum PlanError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Profile(#[from] InputError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The workload asks for something impossible (zero context, an offload larger than the model).
    #[error("invalid workload: {0}")]
    #[diagnostic(code(edgefit::workload))]
    Workload(String),
    /// A byte or element count the inputs imply is too large to represent (the plan's TOML integers stop at
    /// `i64::MAX`). The message names the input that made it so.
    #[error("cannot be represented: {0}")]
    #[diagnostic(code(edgefit::unrepresentable))]
    Unrepresentable(String),
    /// The plan could not be rendered (a backstop: the limits checked while planning should make this unreachable).
    #[error("the plan could not be serialized: {0}")]
    #[diagnostic(code(edgefit::serialize))]
    Serialize(String),
}
