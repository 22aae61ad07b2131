//! The Lua and its declarations agree: each script uses the names its
//! declaration binds and no other, answers the declared reply tags, appends
//! the declared events, enqueues the declared work and touches only state
//! fields of [`crate::projection::field::VOCABULARY`].

use std::collections::{BTreeMap, BTreeSet};

use super::declarations::{self, lua_name, Declaration, Layout, Next};
use super::{body_of, full_source, source_of};
use crate::events::work_item::Op;
use crate::events::Event;
use crate::projection::field;

/// Collects a problem instead of stopping at the first.
macro_rules! check {
    ($problems:expr, $cond:expr, $($fmt:tt)*) => {
        if !$cond {
            $problems.push(format!($($fmt)*));
        }
    };
}

/// Fails with every problem collected.
fn none(problems: Vec<String>) {
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A Lua token: what the checks need to tell apart.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Str(String),
    Name(String),
    Number(String),
    Symbol(String),
}

/// Lua's tokens, comments left out (enough Lua for these scripts: short
/// strings with escapes, `--` comments, numbers, names, symbols).
fn tokens(lua: &str) -> Vec<Token> {
    let chars: Vec<char> = lua.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '\'' || c == '"' {
            let mut s = String::new();
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    i += 1;
                }
                s.push(chars[i]);
                i += 1;
            }
            i += 1;
            out.push(Token::Str(s));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Number(chars[start..i].iter().collect()));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Name(chars[start..i].iter().collect()));
        } else if c == '.' && chars.get(i + 1) == Some(&'.') {
            out.push(Token::Symbol("..".into()));
            i += 2;
        } else {
            out.push(Token::Symbol(c.to_string()));
            i += 1;
        }
    }
    out
}

fn is_symbol(t: Option<&Token>, s: &str) -> bool {
    matches!(t, Some(Token::Symbol(x)) if x == s)
}

fn is_name(t: Option<&Token>, s: &str) -> bool {
    matches!(t, Some(Token::Name(x)) if x == s)
}

/// A name in capitals: a binding or a constant.
fn capital(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The expressions of an argument list starting at `from` (after `(` or a
/// comma), each up to the next comma at its depth; stops at the closing `)`.
fn arguments(t: &[Token], from: usize) -> Vec<Vec<Token>> {
    let mut args = vec![Vec::new()];
    let mut depth = 0;
    for tok in &t[from..] {
        match tok {
            Token::Symbol(s) if s == "(" || s == "{" || s == "[" => depth += 1,
            Token::Symbol(s) if (s == ")" || s == "}" || s == "]") && depth == 0 => break,
            Token::Symbol(s) if s == ")" || s == "}" || s == "]" => depth -= 1,
            Token::Symbol(s) if s == "," && depth == 0 => {
                args.push(Vec::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = args.last_mut() {
            last.push(tok.clone());
        }
    }
    args
}

/// An expression as a pattern: its string pieces joined by `..`, anything
/// else `*`; a local bound to such a pattern earlier stands for it. `None`
/// when it has no string piece at all (nothing to check).
fn pattern(expr: &[Token], locals: &BTreeMap<String, String>) -> Option<String> {
    let mut out = String::new();
    let mut known = false;
    let mut piece = Vec::new();
    let flush = |piece: &mut Vec<Token>, out: &mut String, known: &mut bool| {
        match piece.as_slice() {
            [Token::Str(s)] => {
                out.push_str(s);
                *known = true;
            }
            [Token::Name(n)] if locals.contains_key(n) => {
                out.push_str(&locals[n]);
                *known = true;
            }
            [] => {}
            _ => out.push('*'),
        }
        piece.clear();
    };
    for tok in expr {
        if matches!(tok, Token::Symbol(s) if s == "..") {
            flush(&mut piece, &mut out, &mut known);
        } else {
            piece.push(tok.clone());
        }
    }
    flush(&mut piece, &mut out, &mut known);
    known.then_some(out)
}

/// The concatenation `t` starts with (`'g:' .. gen .. ':'`): strings and
/// names joined by `..`, up to the first token that is neither.
fn concatenation(t: &[Token]) -> Vec<Token> {
    let mut out = Vec::new();
    for (k, tok) in t.iter().enumerate() {
        let operand = matches!(tok, Token::Str(_) | Token::Name(_));
        if (k % 2 == 0 && !operand) || (k % 2 == 1 && !matches!(tok, Token::Symbol(s) if s == ".."))
        {
            break;
        }
        out.push(tok.clone());
    }
    if out.len() % 2 == 0 {
        out.pop();
    }
    out
}

/// Whether `pattern` (a `*` for any value) fits `template` (`<...>` for
/// any value); a pattern that is all unknown fits any.
fn fits(pattern: &str, template: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let mut glob = String::new();
    let mut in_angle = false;
    for c in template.chars() {
        match c {
            '<' => {
                in_angle = true;
                glob.push('*');
            }
            '>' => in_angle = false,
            _ if in_angle => {}
            _ => glob.push(c),
        }
    }
    glob_match(glob.as_bytes(), pattern.as_bytes())
}

fn glob_match(glob: &[u8], s: &[u8]) -> bool {
    match glob.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|k| glob_match(rest, &s[k..])),
        Some((c, rest)) => s.first() == Some(c) && glob_match(rest, &s[1..]),
    }
}

/// What one piece of Lua does at the boundary, read from its tokens.
#[derive(Default, Debug)]
struct Reading {
    /// Names in capitals it reads, and those it defines itself.
    capitals: BTreeSet<String>,
    defined: BTreeSet<String>,
    /// `KEYS[n]` / `ARGV[n]` with a literal `n`, and whether either table
    /// is read at all.
    literal_keys: Vec<usize>,
    literal_args: Vec<usize>,
    reads_keys: bool,
    reads_args: bool,
    /// Tags of `reply({'tag', ...})` and `return {'tag', ...}`.
    reply_tags: BTreeSet<String>,
    strings: BTreeSet<String>,
    /// (idempotency key pattern, event type or `*`).
    appends: BTreeSet<(String, String)>,
    /// `'op', '<name>'` pairs.
    ops: BTreeSet<String>,
    /// State hash fields, as patterns.
    fields: BTreeSet<String>,
}

const STATE_COMMANDS: &[(&str, FieldArgs)] = &[
    ("HMGET", FieldArgs::All),
    ("HDEL", FieldArgs::All),
    ("HGET", FieldArgs::First),
    ("HEXISTS", FieldArgs::First),
    ("HINCRBY", FieldArgs::First),
    ("HSET", FieldArgs::Pairs),
];

#[derive(Clone, Copy)]
enum FieldArgs {
    All,
    First,
    Pairs,
}

fn read(lua: &str) -> Reading {
    let t = tokens(lua);
    let mut r = Reading::default();
    let mut locals: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..t.len() {
        let next = |k: usize| t.get(i + k);
        match &t[i] {
            Token::Str(s) => {
                r.strings.insert(s.clone());
                if s == "op" && is_symbol(next(1), ",") {
                    if let Some(Token::Str(op)) = next(2) {
                        r.ops.insert(op.clone());
                    }
                }
            }
            Token::Name(n) if n == "KEYS" || n == "ARGV" => {
                let index = match (is_symbol(next(1), "["), next(2), is_symbol(next(3), "]")) {
                    (true, Some(Token::Number(n)), true) => n.parse().unwrap_or(0),
                    _ => 0,
                };
                let (reads, literals) = if n == "KEYS" {
                    (&mut r.reads_keys, &mut r.literal_keys)
                } else {
                    (&mut r.reads_args, &mut r.literal_args)
                };
                *reads = true;
                if index > 0 {
                    literals.push(index);
                }
            }
            Token::Name(n) if n == "local" => {
                // `local A, B = ...`: A and B are its own; a single local
                // bound to a string pattern stands for it in later fields.
                let mut k = i + 1;
                let mut names = Vec::new();
                while let Some(Token::Name(name)) = t.get(k) {
                    names.push(name.clone());
                    if !is_symbol(t.get(k + 1), ",") {
                        break;
                    }
                    k += 2;
                }
                for name in &names {
                    if capital(name) {
                        r.defined.insert(name.clone());
                    }
                }
                if let ([name], true) = (names.as_slice(), is_symbol(t.get(k + 1), "=")) {
                    let value = concatenation(&t[k + 2..]);
                    match pattern(&value, &locals) {
                        Some(p)
                            if value
                                .iter()
                                .any(|x| matches!(x, Token::Symbol(s) if s == "..")) =>
                        {
                            locals.insert(name.clone(), p);
                        }
                        _ => {
                            locals.remove(name);
                        }
                    }
                }
            }
            Token::Name(n) if capital(n) => {
                r.capitals.insert(n.clone());
            }
            Token::Name(n)
                if n == "reply" && is_symbol(next(1), "(") && is_symbol(next(2), "{") =>
            {
                if let Some(Token::Str(tag)) = next(3) {
                    r.reply_tags.insert(tag.clone());
                }
            }
            Token::Name(n) if n == "return" && is_symbol(next(1), "{") => {
                if let Some(Token::Str(tag)) = next(2) {
                    r.reply_tags.insert(tag.clone());
                }
            }
            Token::Name(n)
                if n == "emit"
                    && is_symbol(next(1), "(")
                    && !is_name(t.get(i.wrapping_sub(1)), "function") =>
            {
                let args = arguments(&t, i + 2);
                if let (Some(key), Some(etype)) = (args.first(), args.get(1)) {
                    let key = pattern(key, &locals).unwrap_or_else(|| "*".into());
                    let etype = match etype.as_slice() {
                        [Token::Str(s)] => s.clone(),
                        _ => "*".into(),
                    };
                    r.appends.insert((key, etype));
                }
            }
            Token::Name(n) if n == "put" && is_symbol(next(1), "(") => {
                if let Some(p) = arguments(&t, i + 2)
                    .first()
                    .and_then(|a| pattern(a, &locals))
                {
                    r.fields.insert(p);
                }
            }
            Token::Name(n) if n == "call" && is_symbol(next(1), "(") => {
                let args = arguments(&t, i + 2);
                let command = match args.first().map(Vec::as_slice) {
                    Some([Token::Str(c)]) => c.clone(),
                    _ => continue,
                };
                let on_state = matches!(args.get(1).map(Vec::as_slice), Some([Token::Name(s)]) if s == "STATE");
                let Some((_, how)) = STATE_COMMANDS.iter().find(|(c, _)| *c == command) else {
                    continue;
                };
                if !on_state {
                    continue;
                }
                let fields: Vec<&Vec<Token>> = match how {
                    FieldArgs::All => args.iter().skip(2).collect(),
                    FieldArgs::First => args.iter().skip(2).take(1).collect(),
                    FieldArgs::Pairs => args.iter().skip(2).step_by(2).collect(),
                };
                for f in fields {
                    if let Some(p) = pattern(f, &locals) {
                        r.fields.insert(p);
                    }
                }
            }
            _ => {}
        }
    }
    r
}

/// The Lua of one part of a script: its own file(s), for what the part
/// itself must declare.
fn part_source(d: &Declaration) -> String {
    if d.name == declarations::PRELUDE.name || d.name == declarations::SETTLE.name {
        source_of(d.name).unwrap_or_default().to_string()
    } else {
        body_of(d)
    }
}

/// Every part: the two shared ones and every script.
fn parts() -> Vec<&'static Declaration> {
    let mut parts: Vec<&'static Declaration> = vec![&declarations::PRELUDE, &declarations::SETTLE];
    parts.extend_from_slice(declarations::ALL);
    parts
}

/// The names a part binds itself (not its layout's).
fn own_bindings(d: &Declaration) -> Vec<String> {
    d.keys.iter().chain(d.args).map(|n| lua_name(n)).collect()
}

#[test]
fn every_script_has_its_source_and_unique_names() {
    let mut seen = BTreeSet::new();
    for d in declarations::ALL {
        assert!(
            source_of(d.name).is_some(),
            "{}: no streams/scripts/{}.lua",
            d.name,
            d.name
        );
        assert!(seen.insert(d.name), "{} declared twice", d.name);
        let names: Vec<String> = d
            .all_keys()
            .iter()
            .chain(&d.all_args())
            .map(|n| lua_name(n))
            .collect();
        let unique: BTreeSet<&String> = names.iter().collect();
        assert_eq!(
            unique.len(),
            names.len(),
            "{}: a key and an argument share a name: {names:?}",
            d.name
        );
    }
}

#[test]
fn each_script_reads_exactly_the_names_it_declares() {
    let mut p = Vec::new();
    for d in declarations::ALL {
        let whole = read(&full_source(d));
        let bound: BTreeSet<String> = d
            .all_keys()
            .iter()
            .chain(&d.all_args())
            .map(|n| lua_name(n))
            .collect();
        for name in &whole.capitals {
            check!(
                p,
                bound.contains(name) || whole.defined.contains(name),
                "{}.lua reads {name}, which its declaration does not bind (declared: {bound:?})",
                d.name
            );
        }
        let own = read(&part_source(d));
        for name in own_bindings(d) {
            check!(
                p,
                own.capitals.contains(&name),
                "{}: declared {name}, which {}.lua never reads",
                d.name,
                d.name
            );
        }
        let (keys, args) = (d.all_keys().len(), d.all_args().len());
        check!(
            p,
            own.literal_keys.iter().all(|&k| k > keys)
                && own.literal_args.iter().all(|&a| a > args),
            "{}.lua reads a declared key or argument by number ({:?}, {:?}): read it by its name",
            d.name,
            own.literal_keys,
            own.literal_args
        );
        check!(
            p,
            !own.reads_keys || d.more_keys.is_some(),
            "{}.lua reads KEYS by number: read its keys by their declared names",
            d.name
        );
        check!(
            p,
            !own.reads_args || d.more_args.is_some(),
            "{}.lua reads ARGV by number: read its arguments by their declared names",
            d.name
        );
    }
    for shared in [&declarations::PRELUDE, &declarations::SETTLE] {
        let own = read(&part_source(shared));
        for name in own_bindings(shared) {
            check!(
                p,
                own.capitals.contains(&name),
                "{}.lua never reads {name}",
                shared.name
            );
        }
        check!(
            p,
            !own.reads_keys && !own.reads_args,
            "{}.lua reads KEYS/ARGV by number",
            shared.name
        );
    }
    none(p);
}

#[test]
fn each_script_answers_the_reply_tags_it_declares() {
    let mut p = Vec::new();
    for d in declarations::ALL {
        let own = read(&part_source(d));
        for tag in &own.reply_tags {
            check!(
                p,
                d.replies.contains(&tag.as_str()),
                "{}.lua answers '{tag}', which its declaration does not list ({:?})",
                d.name,
                d.replies
            );
        }
        for tag in d.replies {
            check!(
                p,
                own.strings.contains(*tag),
                "{}: declared reply '{tag}', which {}.lua never says",
                d.name,
                d.name
            );
        }
    }
    none(p);
}

#[test]
fn each_script_appends_the_events_it_declares() {
    let mut p = Vec::new();
    for d in parts() {
        let own = read(&part_source(d));
        let declared: BTreeSet<(String, String)> = d
            .appends
            .iter()
            .map(|a| {
                let event = if a.event.starts_with('<') {
                    "*"
                } else {
                    a.event
                };
                (a.key.to_string(), event.to_string())
            })
            .collect();
        for (key, event) in &own.appends {
            check!(p,
                declared.iter().any(|(k, e)| e == event && fits(key, k)),
                "{}.lua appends {event} under key {key}, which its declaration does not list ({declared:?})",
                d.name
            );
        }
        for (key, event) in &declared {
            check!(
                p,
                own.appends.iter().any(|(k, e)| e == event && fits(k, key)),
                "{}: declared {event} under key {key}, which {}.lua never appends",
                d.name,
                d.name
            );
            check!(
                p,
                event == "*" || Event::TYPE_NAMES.contains(&event.as_str()),
                "{}: {event} is no event type",
                d.name
            );
        }
    }
    none(p);
}

#[test]
fn each_script_enqueues_the_work_it_declares() {
    for d in parts() {
        let own = read(&part_source(d));
        let declared: BTreeSet<&str> = d
            .next
            .iter()
            .filter_map(|n| match n {
                Next::Enqueues(op) => Some(op.name()),
                Next::Promotes => Some(declarations::UNREADABLE_OP),
                Next::Delays(_) => None,
            })
            .collect();
        let found: BTreeSet<&str> = own.ops.iter().map(String::as_str).collect();
        assert_eq!(
            found, declared,
            "{}: the ops its Lua enqueues and its declaration differ",
            d.name
        );
    }
    assert!(Op::parse(declarations::UNREADABLE_OP).is_none());
}

#[test]
fn every_state_field_a_script_touches_is_in_the_vocabulary() {
    let mut p = Vec::new();
    for d in parts() {
        let own = read(&part_source(d));
        for f in &own.fields {
            if f.chars().all(|c| c == '*') {
                continue;
            }
            let known = match f.strip_prefix("g:*:") {
                Some(name) => field::generation::ALL.contains(&name),
                None => field::VOCABULARY.iter().any(|t| fits(f, t)),
            };
            check!(
                p,
                known,
                "{}.lua touches state field {f}, which projection::field::VOCABULARY does not name",
                d.name
            );
        }
    }
    none(p);
}

#[test]
fn a_script_and_a_declaration_that_disagree_are_told_apart() {
    // The reader must see what the checks rest on: a renamed key, a reply
    // tag, an event and a field out of the vocabulary, in a made-up script.
    let lua = "local gk = 'g:' .. gen .. ':'\n\
               redis.call('HSET', PARKED, seq, X)\n\
               put(gk .. 'nonsense', 1)\n\
               emit('park/' .. seq, 'chunk_parked', d)\n\
               redis.call('XADD', WORK, '*', 'op', 'create')\n\
               return reply({'parked_now'})";
    let r = read(lua);
    assert!(r.capitals.contains("PARKED") && r.capitals.contains("X"));
    assert_eq!(r.reply_tags, BTreeSet::from(["parked_now".to_string()]));
    assert!(r
        .appends
        .contains(&("park/*".to_string(), "chunk_parked".to_string())));
    assert_eq!(r.ops, BTreeSet::from(["create".to_string()]));
    assert!(r.fields.contains("g:*:nonsense"));
    assert!(!field::generation::ALL.contains(&"nonsense"));
    assert!(fits("g:*:group", "g:<gen>:group"));
    assert!(fits("k:park/*", "k:<key>"));
    assert!(!fits("gx:*", "g:<gen>:group"));
    // A script that reads a name its declaration does not bind.
    let d = &declarations::PARK;
    let bound: Vec<String> = d
        .all_keys()
        .iter()
        .chain(&d.all_args())
        .map(|n| lua_name(n))
        .collect();
    assert!(!bound.contains(&"X".to_string()));
}

#[test]
fn the_layouts_come_first_in_call_order() {
    let d = &declarations::FAIL_GENERATION;
    assert_eq!(d.layout, Layout::Settling);
    let keys = d.all_keys();
    assert_eq!(keys.first(), Some(&"state"));
    assert_eq!(keys.last(), Some(&"parked"));
    assert_eq!(keys.len(), 8);
    assert_eq!(d.all_args()[..3], ["batch", "policy", "gen"]);
    assert!(d.bindings().contains("local PARKED = KEYS[8]\n"));
}

/// A call passes its keys and arguments by the declared names, in order;
/// anything else is refused before it reaches Redis.
#[test]
fn a_call_out_of_its_declared_order_is_refused() {
    let scripts = &*super::SCRIPTS;
    let park = || {
        let mut c = scripts.park.call();
        c.key("state", "s").key("events", "e").arg("batch", "b");
        c
    };
    let mut right = park();
    right
        .key("parked", "p")
        .key("work", "w")
        .arg("seq", 1)
        .arg("gen", 0)
        .arg("payload", "x");
    assert_eq!(right.check(), Ok(()));

    let mut swapped = park();
    swapped
        .key("work", "w")
        .key("parked", "p")
        .arg("seq", 1)
        .arg("gen", 0)
        .arg("payload", "x");
    let wrong = swapped.check().expect_err("keys out of order");
    assert!(
        wrong.contains("`work` where `parked` is declared"),
        "{wrong}"
    );

    let mut short = park();
    short.key("parked", "p").key("work", "w").arg("seq", 1);
    let wrong = short.check().expect_err("arguments missing");
    assert!(wrong.contains("argument `gen` not given"), "{wrong}");

    let mut more = park();
    more.key("parked", "p")
        .key("work", "w")
        .arg("seq", 1)
        .arg("gen", 0)
        .arg("payload", "x")
        .more_arg("y");
    assert!(
        more.check().is_err(),
        "park takes nothing after its payload"
    );

    // Optional ones may be left out before the tail: a dead letter without
    // a batch's state goes straight to its field/value pairs.
    let mut letter = scripts.dead_letter.call();
    letter
        .key("dead_letters", "d")
        .key("source", "s")
        .arg("group", "g")
        .arg("entry", "1-0")
        .more_arg("reason")
        .more_arg("why");
    assert_eq!(letter.check(), Ok(()));
}
