//! `load`: add a chunk's messages to its generation's group, then append
//! `chunk_loaded` (only after every piece was accepted: write order replaces
//! recovery logic) and evaluate the generation's completion.

use crate::events::chunk::{ChunkRef, RecipientFields, TemplateRef};
use crate::events::{Chunk, ChunkLoaded, RegistrationFailure};
use crate::projection::{event_key, field};
use crate::provider::model::{write_json_str, write_json_str_content, AddSummary};
use crate::provider::{
    KakaoOptions, Message, MessageType, ProviderError, MAX_MESSAGES_PER_REQUEST,
};
use crate::store::batch::BatchLog;
use crate::worker::ops::{durability_wait, provider_slots, wait_for_disk, OpError, Outcome};
use crate::worker::Ctx;

fn message_type(kind: &str) -> MessageType {
    match kind {
        "LMS" => MessageType::Lms,
        "ATA" => MessageType::Ata,
        "CTA" => MessageType::Cta,
        _ => MessageType::Sms,
    }
}

/// The provider messages of a chunk: the template rendered per recipient.
/// (The worker itself writes their JSON directly: [`add_body`].)
pub fn messages(chunk: &Chunk) -> Vec<Message> {
    let t = &chunk.template;
    let kind = message_type(&t.kind);
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

/// A piece of the template's text, as the request's JSON needs it.
enum Piece<'a> {
    /// Text, escaped.
    Literal(Vec<u8>),
    /// A `#{name}` placeholder; `raw` is its escaped text, for a recipient
    /// without that variable (kept as is, like [`crate::events::Template::render`]).
    Var { name: &'a str, raw: Vec<u8> },
}

/// A JSON string's delimiter. (Spelt as a number: `tests/metrics.rs` finds
/// metric names by pairing the quote characters of this file.)
const QUOTE: u8 = 0x22;

/// The template's share of every message's JSON, encoded once per request.
struct Encoder<'a> {
    /// The `from`, `type` and `text` members, up to the text's first byte.
    head: Vec<u8>,
    text: Vec<Piece<'a>>,
    /// `,"kakaoOptions":{"pfId":…,"templateId":…,"variables":{` for Kakao.
    kakao: Option<Vec<u8>>,
}

impl<'a> Encoder<'a> {
    fn new(t: &TemplateRef<'a>) -> Self {
        let mut head = Vec::with_capacity(64 + t.from.len());
        head.extend_from_slice(b",\"from\":");
        write_json_str(&mut head, t.from);
        head.extend_from_slice(b",\"type\":");
        write_json_str(&mut head, message_type(t.kind).as_str());
        head.extend_from_slice(b",\"text\":");
        head.push(QUOTE);
        // The same scan as `Template::render`.
        let mut text = Vec::new();
        let mut literal = Vec::new();
        let mut rest = t.text;
        while let Some(start) = rest.find("#{") {
            write_json_str_content(&mut literal, &rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) => {
                    if !literal.is_empty() {
                        text.push(Piece::Literal(std::mem::take(&mut literal)));
                    }
                    let mut raw = Vec::new();
                    write_json_str_content(&mut raw, &rest[start..start + 2 + end + 1]);
                    text.push(Piece::Var {
                        name: &after[..end],
                        raw,
                    });
                    rest = &after[end + 1..];
                }
                None => {
                    write_json_str_content(&mut literal, &rest[start..]);
                    rest = "";
                }
            }
        }
        write_json_str_content(&mut literal, rest);
        if !literal.is_empty() {
            text.push(Piece::Literal(literal));
        }
        let kakao = t.kakao_options.map(|k| {
            let mut v = Vec::with_capacity(64 + k.pf_id.len() + k.template_id.len());
            v.extend_from_slice(b",\"kakaoOptions\":{\"pfId\":");
            write_json_str(&mut v, k.pf_id);
            v.extend_from_slice(b",\"templateId\":");
            write_json_str(&mut v, k.template_id);
            v.extend_from_slice(b",\"variables\":{");
            v
        });
        Encoder { head, text, kakao }
    }

    /// Appends one recipient's message, as `serde_json` writes its
    /// [`Message`].
    fn message(&self, out: &mut Vec<u8>, r: &impl RecipientFields) {
        out.extend_from_slice(b"{\"to\":");
        write_json_str(out, r.to());
        out.extend_from_slice(&self.head);
        for piece in &self.text {
            match piece {
                Piece::Literal(bytes) => out.extend_from_slice(bytes),
                Piece::Var { name, raw } => match r.var(name) {
                    Some(v) => write_json_str_content(out, v),
                    None => out.extend_from_slice(raw),
                },
            }
        }
        out.push(QUOTE);
        if let Some(kakao) = &self.kakao {
            out.extend_from_slice(kakao);
            write_variables(out, r);
            out.extend_from_slice(b"}}");
        }
        out.push(b'}');
    }
}

/// The Kakao variables `{"#{name}":value,...}` (without the braces), in the
/// order of their `#{name}` keys, as the `BTreeMap` of [`KakaoOptions`] has
/// them.
fn write_variables(out: &mut Vec<u8>, r: &impl RecipientFields) {
    let entry = |out: &mut Vec<u8>, i: usize, name: &str, value: &str| {
        if i > 0 {
            out.push(b',');
        }
        out.push(QUOTE);
        out.extend_from_slice(b"#{");
        write_json_str_content(out, name);
        out.push(b'}');
        out.push(QUOTE);
        out.push(b':');
        write_json_str(out, value);
    };
    // By name and by `#{name}` the order is the same, unless a name is a
    // prefix of another ("a" < "ab", but "#{ab}" < "#{a}"); in name order
    // such a name is directly followed by one it prefixes.
    let mut names = r.vars().map(|(n, _)| n);
    let reordered = names.next().is_some_and(|first| {
        let mut prev = first;
        names.any(|n| {
            let prefix = n.starts_with(prev);
            prev = n;
            prefix
        })
    });
    if !reordered {
        for (i, (n, v)) in r.vars().enumerate() {
            entry(out, i, n, v);
        }
        return;
    }
    let mut sorted: Vec<(&str, &str)> = r.vars().collect();
    sorted.sort_by(|(a, _), (b, _)| a.bytes().chain(Some(b'}')).cmp(b.bytes().chain(Some(b'}'))));
    for (i, (n, v)) in sorted.into_iter().enumerate() {
        entry(out, i, n, v);
    }
}

/// The body of one add request for these recipients of a chunk with
/// template `t` (at most [`MAX_MESSAGES_PER_REQUEST`] of them): byte for byte
/// what `serde_json` writes for the [`messages`] of those recipients, but
/// written directly, without them.
pub fn add_body<R: RecipientFields>(t: &TemplateRef<'_>, recipients: &[R]) -> Vec<u8> {
    const OPEN: &[u8] = b"{\"messages\":[";
    let enc = Encoder::new(t);
    let mut out = Vec::with_capacity(OPEN.len() + 256);
    out.extend_from_slice(OPEN);
    for (i, r) in recipients.iter().enumerate() {
        if i == 0 {
            enc.message(&mut out, r);
            // Room for the rest, sized on the first message (and an eighth
            // more, for longer numbers and values).
            let one = out.len() - OPEN.len() + 1;
            let rest = recipients.len() - 1;
            out.reserve(one * rest + one * rest / 8 + 2);
            continue;
        }
        out.push(b',');
        enc.message(&mut out, r);
    }
    out.extend_from_slice(b"]}");
    out
}

/// Adds every recipient, one request per [`MAX_MESSAGES_PER_REQUEST`], and
/// sums the answers (failures by their position in `recipients`).
async fn add_all<R: RecipientFields>(
    ctx: &Ctx,
    group_id: &str,
    template: &TemplateRef<'_>,
    recipients: &[R],
) -> Result<AddSummary, ProviderError> {
    let mut total = AddSummary::default();
    for (k, part) in recipients.chunks(MAX_MESSAGES_PER_REQUEST).enumerate() {
        let body = add_body(template, part);
        let s = ctx
            .provider
            .add_messages_json(group_id, body, part.len())
            .await?;
        let offset = k * MAX_MESSAGES_PER_REQUEST;
        total.error_count += s.error_count;
        total.results += s.results;
        total.registered += s.registered;
        total.duplicates += s.duplicates;
        total
            .failed
            .extend(s.failed.into_iter().map(|(i, code)| (i + offset, code)));
    }
    Ok(total)
}

/// Loads `chunk` into `group_id` and records it.
pub async fn run(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &Chunk,
    gen: u32,
    group_id: &str,
) -> Result<Outcome, OpError> {
    let template = chunk.template.view();
    load(
        ctx,
        log,
        chunk.seq,
        &template,
        &chunk.recipients,
        gen,
        group_id,
    )
    .await
}

/// [`run`] for a chunk read in place ([`ChunkRef::decode`]).
pub async fn run_ref(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    gen: u32,
    group_id: &str,
) -> Result<Outcome, OpError> {
    load(
        ctx,
        log,
        chunk.seq,
        &chunk.template,
        &chunk.recipients,
        gen,
        group_id,
    )
    .await
}

/// Loads chunk `seq` (`template`, `recipients`) into `group_id`.
async fn load<R: RecipientFields + Sync>(
    ctx: &Ctx,
    log: &BatchLog,
    seq: u32,
    template: &TemplateRef<'_>,
    recipients: &[R],
    gen: u32,
    group_id: &str,
) -> Result<Outcome, OpError> {
    if !ctx.config.durable_after.is_zero() {
        // The add relies on the chunk's assignment to `gen` and on `group_id`
        // being that generation's group: both must still hold (an item from
        // writes Redis lost is dropped; its chunk is loaded through what
        // survived: it is parked again, or its ingest entry redelivered) and
        // be on disk before the provider registers anyone.
        let (assign_key, group_key) = (event_key::assign(seq), event_key::group(gen));
        let p = log
            .read(&[
                field::assignment(seq),
                field::group(gen),
                field::key(&assign_key),
                field::key(&group_key),
            ])
            .await?;
        let assigned_gen = p.assignment(seq).map(|(g, _, _)| g);
        if assigned_gen != Some(gen) || p.group_of(gen) != Some(group_id) {
            tracing::warn!(
                batch = %log.batch, seq, gen, group = group_id,
                assigned = ?assigned_gen, recorded = ?p.group_of(gen),
                "load of a chunk into a group our events no longer show for it (lost Redis writes?): dropped"
            );
            metrics::counter!("groupcast_chunks_total", "outcome" => "stale").increment(1);
            return Ok(Outcome::Done);
        }
        let ids: Vec<&str> = [p.appended(&assign_key), p.appended(&group_key)]
            .into_iter()
            .flatten()
            .collect();
        if let Some(delay) = durability_wait(ctx, log, &ids).await? {
            return Ok(wait_for_disk(
                delay,
                format!("chunk {seq} was just assigned to generation {gen} or its group"),
            ));
        }
    }
    let requests = recipients.len().div_ceil(MAX_MESSAGES_PER_REQUEST) as u32;
    if let Some(back) = provider_slots(ctx, requests).await? {
        return Ok(back);
    }
    let summary = match add_all(ctx, group_id, template, recipients).await {
        Ok(s) => s,
        Err(e) => {
            let outcome = Outcome::from_provider(&e);
            if matches!(outcome, Outcome::Dead(_)) {
                // A repeat delivery racing the original can find the group
                // already sent (400 InvalidGroupStatus): harmless if the chunk
                // is recorded as loaded.
                if log.is_loaded(gen, seq).await? {
                    return Ok(Outcome::Done);
                }
            }
            return Ok(outcome);
        }
    };
    // 1026 counts as registered: already in this group, i.e. an earlier
    // attempt of this very add registered it (the response was lost).
    let duplicates = summary.duplicates;
    let registered = summary.registered + duplicates;
    // Each failure's position is that of a result, and there is exactly one
    // result per recipient (`add_messages_json` checks).
    let failed: Vec<RegistrationFailure> = summary
        .failed
        .into_iter()
        .map(|(i, code)| RegistrationFailure {
            to: recipients[i].to().to_string(),
            code,
        })
        .collect();
    let failures = failed.len() as u64;
    let event = ChunkLoaded {
        gen,
        seq,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::chunk::KakaoTemplate;
    use crate::events::{Recipient, Template};
    use crate::provider::model::AddMessagesRequest;

    fn chunk(text: &str, kakao: bool, recipients: Vec<Recipient>) -> Chunk {
        Chunk {
            batch: "b".into(),
            seq: 0,
            last: true,
            template: Template {
                kind: if kakao { "ATA" } else { "LMS" }.into(),
                from: "02\\12\"34\"5678".into(),
                text: text.into(),
                kakao_options: kakao.then(|| KakaoTemplate {
                    pf_id: "pf\n1".into(),
                    template_id: "tp".into(),
                }),
            },
            recipients,
        }
    }

    fn r(to: &str, vars: &[(&str, &str)]) -> Recipient {
        Recipient {
            to: to.into(),
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_body_is_serde_jsons_of_the_messages() {
        let people = vec![
            r("01000000001", &[("name", "Kim"), ("code", "1\"2\"")]),
            r(
                "01000000002",
                &[("name", "é\t한"), ("a", "x"), ("ab", "y"), ("a}", "z")],
            ),
            r("0100\u{1}0003", &[]),
            r(
                "01000000004",
                &[
                    ("", "empty"),
                    ("b", "\\"),
                    ("ba", "1"),
                    ("bab", "2"),
                    ("c", "3"),
                ],
            ),
        ];
        for text in [
            "Hi #{name}, code #{code}. #{missing} #{",
            "",
            "#{name}",
            "#{name}#{name}\"\"\n#{}#{a}#{ab}}",
            "no placeholders \\ \u{7}",
            "#{ oops",
        ] {
            for kakao in [false, true] {
                let c = chunk(text, kakao, people.clone());
                let view = c.view();
                for range in [0..c.recipients.len(), 0..1, 2..c.recipients.len()] {
                    let part = &c.recipients[range.clone()];
                    let mine = add_body(&c.template.view(), part);
                    let borrowed = add_body(&view.template, &view.recipients[range]);
                    let msgs = messages(&Chunk {
                        recipients: part.to_vec(),
                        ..c.clone()
                    });
                    let theirs =
                        serde_json::to_vec(&AddMessagesRequest { messages: &msgs }).unwrap();
                    assert!(
                        mine == theirs,
                        "{text:?} kakao={kakao}\n{}\n{}",
                        String::from_utf8_lossy(&mine),
                        String::from_utf8_lossy(&theirs)
                    );
                    assert!(borrowed == theirs);
                }
            }
        }
        let empty = chunk("x", false, vec![]);
        let none: &[Recipient] = &[];
        assert_eq!(
            add_body(&empty.template.view(), none),
            br#"{"messages":[]}"#
        );
    }
}
