//! Runtime records of the configuration must not implement serde, and the
//! resolved configuration must stay move-only: these programs must not
//! compile.

#[test]
fn runtime_records_refuse_serde_and_clone() {
    trybuild::TestCases::new().compile_fail("tests/compile-fail/*.rs");
}
