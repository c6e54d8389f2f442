//! The engine executes a plan produced by the planner: it loads a checkpoint, places the weights as the plan
//! says, sizes the caches from the plan and generates tokens with the kernels crate.
//!
//! Not built yet: the engine has no issue of its own so far. This crate exists so the workspace has the shape of
//! ARCHITECTURE.md and the dependency direction (planner, kernels -> engine) is fixed from the start.
