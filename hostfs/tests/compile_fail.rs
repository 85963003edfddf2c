//! A confined path plan owns a descriptor: it must never implement serde.
//! These programs must not compile.

#[test]
fn plans_refuse_serde() {
    trybuild::TestCases::new().compile_fail("tests/compile-fail/*.rs");
}
