//! Shared helpers for Lazaret's end-to-end tests: locating the built binaries
//! and making scratch directories. Trusts nothing from the environment but
//! `CARGO_BIN_EXE_*` style locations it derives itself.
