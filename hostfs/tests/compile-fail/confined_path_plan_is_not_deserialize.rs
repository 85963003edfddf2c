// A ConfinedPathPlan owns a descriptor: it must not cross a codec.
fn requires<T: for<'de> serde::Deserialize<'de>>() {}

fn main() {
    requires::<lazaret_hostfs::plan::ConfinedPathPlan>();
}
