// Resolved environment values cannot be formatted for people or logs.
fn requires<T: std::fmt::Display>() {}

fn main() {
    requires::<lazaret_coordinator::config::SecretValue>();
}
