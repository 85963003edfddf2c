//! Every table of the Domain Store. Table names are on-disk format: they
//! never change. Values are `proto` records in their versioned codec.

use redb::TableDefinition;

/// `schema` → the encoded `StoreMetadata`.
pub const METADATA: TableDefinition<&str, &[u8]> = TableDefinition::new("metadata");

/// The key of the metadata row.
pub const METADATA_KEY: &str = "schema";

/// `domain` → the encoded `Domain`.
pub const DOMAIN: TableDefinition<&str, &[u8]> = TableDefinition::new("domain");

/// The key of the Domain row.
pub const DOMAIN_KEY: &str = "domain";

/// Generation number → the encoded `Generation`.
pub const GENERATIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("generations");

/// (generation number, participant slot) → the encoded `Participant`.
pub const PARTICIPANTS: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("participants");

/// (generation number, session id) → the encoded `Session`.
pub const SESSIONS: TableDefinition<(u64, u128), &[u8]> = TableDefinition::new("sessions");

/// (generation number, session id) → the encoded `SessionTerminal`.
pub const SESSION_TERMINALS: TableDefinition<(u64, u128), &[u8]> =
    TableDefinition::new("session_terminals");

/// Generation number → the encoded `WorkspaceRules` that generation's
/// Workspace Router was given. Only the newest row is kept: the next `up`
/// compares the rules it takes from the host with it.
pub const WORKSPACE_RULES: TableDefinition<u64, &[u8]> = TableDefinition::new("workspace_rules");
