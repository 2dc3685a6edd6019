//! Integration tests live in `tests/tests/`.
