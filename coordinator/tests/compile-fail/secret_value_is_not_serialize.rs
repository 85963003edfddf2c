// Resolved environment values are never serialized.
fn requires<T: serde::Serialize>() {}

fn main() {
    requires::<lazaret_coordinator::config::SecretValue>();
}
