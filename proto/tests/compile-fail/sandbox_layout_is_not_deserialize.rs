// SandboxLayoutV1 cannot be decoded: only its production constructor makes one.
fn requires<T: for<'de> serde::Deserialize<'de>>() {}

fn main() {
    requires::<lazaret_proto::layout::SandboxLayoutV1>();
}
