//! The body of an add request (`PUT /messages/v4/groups/{groupId}/messages`),
//! written straight from a chunk's template and recipients: byte for byte
//! what `serde_json` writes for their [`Message`]s, without building them
//! (the worker's hot path). [`messages`] builds them, for reference.

use super::model::{KakaoOptions, Message, MessageType};
use crate::events::chunk::{RecipientFields, TemplateRef};
use crate::events::Chunk;

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
        head.push(b'"');
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
        out.push(b'"');
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
        out.push(b'"');
        out.extend_from_slice(b"#{");
        write_json_str_content(out, name);
        out.push(b'}');
        out.push(b'"');
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
/// template `t` (at most [`super::MAX_MESSAGES_PER_REQUEST`] of them): byte for byte
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

/// Appends `s` as a JSON string, byte for byte as `serde_json` writes it.
#[inline]
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    write_json_str_content(out, s);
    out.push(b'"');
}

/// Appends `s` escaped as inside a JSON string (without the quotes), byte
/// for byte as `serde_json` escapes it: `"`, `\` and control characters only.
#[inline]
pub(crate) fn write_json_str_content(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| needs_escape(b)) {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[inline]
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::chunk::KakaoTemplate;
    use crate::events::{Recipient, Template};
    use crate::provider::model::AddMessagesRequest;

    #[test]
    fn json_strings_are_serde_jsons() {
        let mut all: String = (0u8..0x80).map(char::from).collect();
        all.push_str("é한\u{2028}\u{7f}\"\\");
        for s in [all.as_str(), "", "plain", "a\"b", "\\", "\u{1}x\u{1f}"] {
            let mut out = Vec::new();
            write_json_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

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
            options: Default::default(),
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
