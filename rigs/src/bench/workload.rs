//! The workloads' sizes, the flags applied to them, and the chunks each append
//! writes.

use std::collections::BTreeMap;

use super::{BenchArgs, Workload};
use groupcast::cli::CliError;
use groupcast::events::{Chunk, Recipient, Template};

/// Chunks appended at a time: W5's ten million recipients are never all in
/// memory at once.
pub(super) const CHUNKS_PER_APPEND: usize = 50;

/// A workload's sizes, before the flags override them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sizes {
    pub(super) name: &'static str,
    pub(super) recipients: usize,
    pub(super) batches: usize,
    pub(super) chunk_size: usize,
    pub(super) group_cap: u64,
}

impl Workload {
    pub(super) fn sizes(self) -> Sizes {
        match self {
            Workload::W1 => Sizes {
                name: "W1",
                recipients: 1_000_000,
                batches: 1,
                chunk_size: 5_000,
                group_cap: 1_000_000,
            },
            Workload::W2 => Sizes {
                name: "W2",
                recipients: 200_000,
                batches: 1,
                chunk_size: 1_000,
                group_cap: 1_000_000,
            },
            Workload::W3 => Sizes {
                name: "W3",
                recipients: 1_000,
                batches: 100,
                chunk_size: 100,
                group_cap: 1_000_000,
            },
            Workload::W4 => Sizes {
                name: "W4",
                recipients: 1_000_000,
                batches: 1,
                chunk_size: 5_000,
                group_cap: 100_000,
            },
            Workload::W5 => Sizes {
                name: "W5",
                recipients: 10_000_000,
                batches: 1,
                chunk_size: 10_000,
                group_cap: 1_000_000,
            },
        }
    }
}

/// The sizes without `--workload`.
pub(super) const CUSTOM: Sizes = Sizes {
    name: "custom",
    recipients: 100_000,
    batches: 1,
    chunk_size: 1_000,
    group_cap: 1_000_000,
};

/// What one run does: the workload's sizes with the flags applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) name: String,
    /// Recipients per batch.
    pub(super) recipients: usize,
    pub(super) batches: usize,
    pub(super) chunk_size: usize,
    pub(super) group_cap: u64,
    /// Worker processes, as asked for.
    pub(super) workers: usize,
}

impl BenchArgs {
    pub(super) fn plan(&self) -> Result<Plan, CliError> {
        let sizes = self.workload.map_or(CUSTOM, Workload::sizes);
        let scale = |n: usize| ((n as f64 * self.scale).round() as usize).max(1);
        let plan = Plan {
            name: sizes.name.to_string(),
            recipients: self.recipients.unwrap_or_else(|| scale(sizes.recipients)),
            batches: self.batches.unwrap_or(sizes.batches),
            chunk_size: self.chunk_size.unwrap_or(sizes.chunk_size),
            group_cap: self.group_cap.unwrap_or(sizes.group_cap),
            workers: self.workers,
        };
        if plan.chunk_size == 0 || plan.chunk_size > groupcast::events::chunk::MAX_CHUNK_RECIPIENTS
        {
            return Err(CliError::Usage(
                "--chunk-size must be between 1 and 10000".into(),
            ));
        }
        if plan.recipients * plan.batches > 100_000_000 {
            return Err(CliError::Usage(
                "at most 100,000,000 recipients in all (numbers are 8-digit)".into(),
            ));
        }
        Ok(plan)
    }
}

impl Plan {
    /// Recipients over every batch.
    pub(super) fn total_recipients(&self) -> u64 {
        (self.recipients * self.batches) as u64
    }

    pub(super) fn batch_ids(&self) -> Vec<String> {
        (0..self.batches).map(|b| format!("bench-{b}")).collect()
    }

    /// Where each append of a batch starts, in recipients.
    pub(super) fn append_starts(&self) -> impl Iterator<Item = usize> {
        (0..self.recipients).step_by(self.chunk_size * CHUNKS_PER_APPEND)
    }

    /// The chunks of one append: the batch's recipients from `from`, at most
    /// [`CHUNKS_PER_APPEND`] chunks of them, numbered within the whole batch.
    pub(super) fn append_chunks(
        &self,
        template: &Template,
        index: usize,
        batch: &str,
        from: usize,
    ) -> Vec<Chunk> {
        let n = (self.chunk_size * CHUNKS_PER_APPEND).min(self.recipients - from);
        let chunks_in_batch = self.recipients.div_ceil(self.chunk_size) as u32;
        let first_seq = (from / self.chunk_size) as u32;
        let mut part = groupcast::producer::cut(
            batch,
            template,
            recipients(index, self.recipients, from, n),
            self.chunk_size,
        );
        for c in &mut part {
            c.seq += first_seq;
            c.last = c.seq + 1 == chunks_in_batch;
        }
        part
    }
}

/// Recipients `from..from + n` of batch `batch` (of `per_batch`).
pub(super) fn recipients(batch: usize, per_batch: usize, from: usize, n: usize) -> Vec<Recipient> {
    (from..from + n)
        .map(|i| Recipient {
            to: format!("010{:08}", (batch * per_batch + i) % 100_000_000),
            vars: BTreeMap::from([("name".to_string(), format!("c{i}"))]),
        })
        .collect()
}

pub(super) fn bench_template() -> Template {
    Template {
        kind: "SMS".into(),
        from: "0212345678".into(),
        text: "#{name}, your order shipped".into(),
        kakao_options: None,
    }
}
