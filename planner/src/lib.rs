//! The planner compiles a model's `config.json` (+ quantization metadata) and a device profile into a validated
//! execution plan. It is pure: no IO, no clocks, no device queries — callers (xtask, the engine) read files and pass
//! their text in, and render the plan the planner returns.
//!
//! The model side lives in [`model`]; the device side is [`profile`] (measured facts), [`workload`],
//! [`weight_path`] (format + kernel per device), [`placement`] (every tensor in exactly one pool), [`admission`]
//! (ledgers and the verdict), [`prompt_chunk`] (the prompt's step size and its memory), [`predict`] (decode/prefill
//! rates and the bound) and [`plan`] (the serialized plan).

// Input errors carry their file's text and a span so miette can show the offending line; they are built once, on
// the failure path, so a large `Err` variant costs nothing that matters and boxing would only add noise.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod error;
pub mod model;
pub mod placement;
pub mod plan;
pub mod predict;
pub mod profile;
pub mod prompt_chunk;
#[cfg(test)]
mod testutil;
pub mod weight_path;
pub mod workload;

pub use admission::Verdict;
pub use error::{InputError, PlanError};
pub use plan::{Plan, PLANNER_VERSION};
pub use profile::{parse_profile, DeviceProfile};
pub use workload::Workload;
