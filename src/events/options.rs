//! Batch options (stub of the priority only, until main has the full module).

use serde::{Deserialize, Serialize};

/// A batch's priority: which lane its work goes through.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Ahead of everything else (one-time passwords, alerts).
    Urgent,
    /// The default.
    #[default]
    Normal,
    /// Behind everything else, with a guaranteed share.
    Bulk,
}

impl Priority {
    /// Every priority, most urgent first.
    pub const ALL: [Priority; 3] = [Priority::Urgent, Priority::Normal, Priority::Bulk];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::Normal => "normal",
            Priority::Bulk => "bulk",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.name() == s)
    }
}
