//! The planner compiles a model's `config.json` (+ quantization metadata) and a device profile into a validated
//! execution plan. It is pure: no IO, no clocks, no device queries — callers (xtask, the engine) read files and pass
//! their text in, and render the plan the planner returns.

pub mod model;
