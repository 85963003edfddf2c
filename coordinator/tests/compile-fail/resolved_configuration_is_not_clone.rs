// A ResolvedDomainConfiguration is move-only: there is exactly one owner.
fn requires<T: Clone>() {}

fn main() {
    requires::<lazaret_coordinator::config::ResolvedDomainConfiguration>();
}
