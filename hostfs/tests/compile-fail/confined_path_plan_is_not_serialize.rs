// A ConfinedPathPlan owns a descriptor: it must not cross a codec.
fn requires<T: serde::Serialize>() {}

fn main() {
    requires::<lazaret_hostfs::plan::ConfinedPathPlan>();
}
