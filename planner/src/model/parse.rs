//! The entry point from model card text to [`ModelSpec`]: parse the JSON with spans, pick the architecture family,
//! and let it read its fields.

use super::arch::{architecture_name, BuildCx, FAMILIES};
use super::config::Doc;
use super::error::ModelError;
use super::{ModelCard, ModelSpec};

/// Parses a model card (a Hugging Face `config.json`, plus `hf_quant_config.json` for modelopt checkpoints) into a
/// [`ModelSpec`] with its full inventory. Every failure is a [`ModelError`] that points into the file at fault.
pub fn parse_model(card: &ModelCard) -> Result<ModelSpec, ModelError> {
    let doc = Doc::parse(&card.config)?;
    let hf_quant = match &card.quant_config {
        Some(f) => Some(Doc::parse(f)?),
        None => None,
    };
    let root = doc.root();
    let arch = architecture_name(&root)?;
    let model_type = root.opt_str("model_type")?;
    // The architecture decides when it is known; a config whose `architectures` names a variant we do not list
    // (e.g. a text-only class) is still read when its `model_type` is known.
    let family = FAMILIES
        .iter()
        .find(|f| {
            arch.as_deref()
                .is_some_and(|a| f.architectures().contains(&a))
        })
        .or_else(|| {
            FAMILIES
                .iter()
                .find(|f| model_type.is_some_and(|m| f.model_types().contains(&m)))
        });
    let Some(family) = family else {
        let found = arch
            .clone()
            .or(model_type.map(str::to_string))
            .unwrap_or_else(|| "(none)".into());
        // Point at the first architecture string when there is one, else at `model_type`, else at the object.
        let first_arch = root
            .field("architectures")
            .and_then(|f| f.items().ok())
            .and_then(|v| v.into_iter().next());
        let span = match (
            first_arch,
            root.field("architectures"),
            root.field("model_type"),
        ) {
            (Some(f), _, _) | (None, Some(f), _) | (None, None, Some(f)) => f.span(),
            (None, None, None) => root.head_span(),
        };
        return Err(ModelError::Unsupported {
            found,
            supported: supported_architectures().join(", "),
            src: doc.src(),
            span: span.into(),
        });
    };
    let cx = BuildCx {
        id: &card.id,
        root,
        hf_quant: hf_quant.as_ref(),
    };
    family.build(&cx)
}

/// Every `architectures` value the planner reads, for help texts and error messages.
pub fn supported_architectures() -> &'static [&'static str] {
    &[
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3NextForCausalLM",
        "Spark2_5ForCausalLM",
        "Gemma3ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen2ForCausalLM",
        "LlamaForCausalLM",
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_list_matches_the_families() {
        let from_families: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| f.architectures().iter().copied())
            .collect();
        let mut a = from_families.clone();
        let mut b = supported_architectures().to_vec();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }
}
