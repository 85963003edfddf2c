//! `SandboxLayoutV1` is a runtime value without an unchecked constructor:
//! these programs must not compile.

#[test]
fn sandbox_layout_refuses_serde_and_unchecked_construction() {
    trybuild::TestCases::new().compile_fail("tests/compile-fail/*.rs");
}
