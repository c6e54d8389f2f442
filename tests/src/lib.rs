//! Workspace-level end-to-end tests live in `tests/tests/`. This library is empty on purpose.
