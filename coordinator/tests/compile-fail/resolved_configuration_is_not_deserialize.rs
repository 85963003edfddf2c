// A ResolvedDomainConfiguration is a runtime value: it must not cross a codec.
fn requires<T: for<'de> serde::Deserialize<'de>>() {}

fn main() {
    requires::<lazaret_coordinator::config::ResolvedDomainConfiguration>();
}
