// SandboxLayoutV1 has no public constructor that could omit `/workspace`.
fn main() {
    let _ = lazaret_proto::layout::SandboxLayoutV1 { protected: Vec::new() };
}
