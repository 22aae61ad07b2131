//! `load`: add a chunk's messages to its generation's group, then append
//! `chunk_loaded` (only after every piece was accepted: write order replaces
//! recovery logic) and evaluate the generation's completion.

use crate::events::{Chunk, ChunkLoaded, RegistrationFailure};
use crate::provider::{KakaoOptions, Message, MessageType, Registration};
use crate::store::batch::BatchLog;
use crate::worker::ops::{durability_wait, wait_for_disk, OpError, Outcome};
use crate::worker::Ctx;

/// The provider messages of a chunk: the template rendered per recipient.
pub fn messages(chunk: &Chunk) -> Vec<Message> {
    let t = &chunk.template;
    let kind = match t.kind.as_str() {
        "LMS" => MessageType::Lms,
        "ATA" => MessageType::Ata,
        "CTA" => MessageType::Cta,
        _ => MessageType::Sms,
    };
    chunk
        .recipients
        .iter()
        .map(|r| Message {
            to: r.to.clone(),
            from: t.from.clone(),
            r#type: kind,
            text: t.render(&r.vars),
            kakao_options: t.kakao_options.as_ref().map(|k| KakaoOptions {
                pf_id: k.pf_id.clone(),
                template_id: k.template_id.clone(),
                variables: r
                    .vars
                    .iter()
                    .map(|(n, v)| (format!("#{{{n}}}"), v.clone()))
                    .collect(),
            }),
        })
        .collect()
}

/// Loads `chunk` into `group_id` and records it.
pub async fn run(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &Chunk,
    gen: u32,
    group_id: &str,
) -> Result<Outcome, OpError> {
    if !ctx.config.durable_after.is_zero() {
        // The add relies on the chunk's assignment to `gen` and on `group_id`
        // being that generation's group: both must still hold (an item from
        // writes Redis lost is dropped; its chunk is loaded through what
        // survived: it is parked again, or its ingest entry redelivered) and
        // be on disk before the provider registers anyone.
        let seq = chunk.seq;
        let f = log
            .fields(&[
                format!("s:{seq}"),
                format!("g:{gen}:group"),
                format!("k:assign/{seq}"),
                format!("k:group/{gen}"),
            ])
            .await?;
        let assigned_gen = f[0]
            .as_deref()
            .and_then(|s| s.split('|').next())
            .and_then(|g| g.parse::<u32>().ok());
        if assigned_gen != Some(gen) || f[1].as_deref() != Some(group_id) {
            tracing::warn!(
                batch = %log.batch, seq, gen, group = group_id,
                assigned = ?assigned_gen, recorded = ?f[1],
                "load of a chunk into a group our events no longer show for it (lost Redis writes?): dropped"
            );
            metrics::counter!("groupcast_chunks_total", "outcome" => "stale").increment(1);
            return Ok(Outcome::Done);
        }
        let ids: Vec<&str> = f[2..].iter().flatten().map(String::as_str).collect();
        if let Some(delay) = durability_wait(ctx, &ids).await? {
            return Ok(wait_for_disk(
                delay,
                format!("chunk {seq} was just assigned to generation {gen} or its group"),
            ));
        }
    }
    let msgs = messages(chunk);
    let requests = msgs
        .len()
        .div_ceil(crate::provider::MAX_MESSAGES_PER_REQUEST) as u32;
    ctx.limiter.acquire(requests).await?;
    let results = match ctx.provider.add_messages(group_id, &msgs).await {
        Ok(r) => r,
        Err(e) => {
            let outcome = Outcome::from_provider(&e);
            if matches!(outcome, Outcome::Dead(_)) {
                // A repeat delivery racing the original can find the group
                // already sent (400 InvalidGroupStatus): harmless if the chunk
                // is recorded as loaded.
                let key = format!("k:loaded/{gen}/{}", chunk.seq);
                if log
                    .fields(&[key])
                    .await?
                    .first()
                    .is_some_and(Option::is_some)
                {
                    return Ok(Outcome::Done);
                }
            }
            return Ok(outcome);
        }
    };
    let mut registered = 0u32;
    let mut duplicates = 0u32;
    let mut failed = Vec::new();
    for (r, m) in results.iter().zip(&msgs) {
        match r {
            Registration::Registered { .. } => registered += 1,
            // 1026: already in this group, i.e. an earlier attempt of this
            // very add registered it (the response was lost).
            Registration::Duplicate => {
                registered += 1;
                duplicates += 1;
            }
            Registration::Failed { code } => failed.push(RegistrationFailure {
                to: m.to.clone(),
                code: code.clone(),
            }),
        }
    }
    let failures = failed.len() as u64;
    let event = ChunkLoaded {
        gen,
        seq: chunk.seq,
        group_id: group_id.to_string(),
        registered,
        duplicates,
        failed,
    };
    if let Some(ready) = log.loaded(&event).await? {
        // Counted only when the loaded event is new: a chunk loaded twice
        // (a repeat delivery racing the first) counts its recipients once,
        // so the counters add up to the batches' registered totals.
        metrics::counter!("groupcast_chunks_total", "outcome" => "loaded").increment(1);
        metrics::counter!("groupcast_recipients_registered_total").increment(u64::from(registered));
        metrics::counter!("groupcast_recipients_failed_total").increment(failures);
        if ready {
            tracing::info!(batch = %log.batch, gen, "generation complete: send enqueued");
        }
    }
    Ok(Outcome::Done)
}
