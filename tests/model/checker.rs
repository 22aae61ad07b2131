//! A small explicit-state model checker: breadth-first over every action
//! sequence, visited states kept as 64-bit fingerprints, `always` properties
//! checked on every state, `eventually` properties on every final state (one
//! with no action left), counterexamples as the shortest action sequence.

use std::collections::{HashSet, VecDeque};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};

/// A system the checker explores.
pub trait Model: Clone {
    /// One step of the system or its environment.
    type Action: Clone + Debug;
    /// Every action possible in this state.
    fn actions(&self, out: &mut Vec<Self::Action>);
    /// The state after `action`.
    fn next(&self, action: &Self::Action) -> Self;
    /// The state's identity (what must be equal for two states to be the same).
    fn identity<H: Hasher>(&self, h: &mut H);
    /// A broken `always` property, if any.
    fn always(&self) -> Option<String>;
    /// A broken `eventually` property, checked when no action is left.
    fn eventually(&self) -> Option<String>;
    /// An action, readably, in the state it is taken from.
    fn describe(&self, action: &Self::Action) -> String;
}

/// What the checker found.
pub struct Report {
    /// Distinct states reached.
    pub states: usize,
    /// Final states (no action left).
    pub finals: usize,
    /// The first broken property, with the actions leading to it.
    pub violation: Option<(String, Vec<String>)>,
    /// The longest action sequence explored.
    pub depth: usize,
}

fn fingerprint<M: Model>(m: &M) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.identity(&mut h);
    h.finish()
}

/// Explores every state reachable from `init` (at most `limit`: a larger
/// space is reported as a violation, never silently cut).
pub fn check<M: Model>(init: M, limit: usize) -> Report {
    let mut seen: HashSet<u64> = HashSet::with_capacity(1 << 20);
    // Per state: its parent and the action from it, to rebuild paths.
    let mut parents: Vec<(u32, Option<M::Action>)> = Vec::with_capacity(1 << 20);
    let mut queue: VecDeque<(M, u32, u32)> = VecDeque::new();
    seen.insert(fingerprint(&init));
    parents.push((0, None));
    queue.push_back((init.clone(), 0, 0));
    let mut finals = 0;
    let mut depth = 0;
    let mut actions = Vec::new();
    let path = |parents: &Vec<(u32, Option<M::Action>)>, mut i: u32| {
        let mut acts = Vec::new();
        while let (p, Some(a)) = &parents[i as usize] {
            acts.push(a.clone());
            i = *p;
        }
        acts.reverse();
        let mut s = init.clone();
        let mut out = Vec::new();
        for a in acts {
            out.push(s.describe(&a));
            s = s.next(&a);
        }
        out
    };
    if let Some(v) = init.always() {
        return Report {
            states: 1,
            finals,
            violation: Some((v, vec![])),
            depth,
        };
    }
    while let Some((state, idx, d)) = queue.pop_front() {
        depth = depth.max(d as usize);
        actions.clear();
        state.actions(&mut actions);
        if actions.is_empty() {
            finals += 1;
            if let Some(v) = state.eventually() {
                return Report {
                    states: seen.len(),
                    finals,
                    violation: Some((format!("eventually: {v}"), path(&parents, idx))),
                    depth,
                };
            }
            continue;
        }
        for a in &actions {
            let next = state.next(a);
            if !seen.insert(fingerprint(&next)) {
                continue;
            }
            let i = parents.len() as u32;
            parents.push((idx, Some(a.clone())));
            if let Some(v) = next.always() {
                return Report {
                    states: seen.len(),
                    finals,
                    violation: Some((format!("always: {v}"), path(&parents, i))),
                    depth,
                };
            }
            if seen.len() > limit {
                return Report {
                    states: seen.len(),
                    finals,
                    violation: Some((format!("more than {limit} states"), vec![])),
                    depth,
                };
            }
            queue.push_back((next, i, d + 1));
        }
    }
    Report {
        states: seen.len(),
        finals,
        violation: None,
        depth,
    }
}

/// Hashes a value into `h` (shorthand for identities).
pub fn put<T: Hash + ?Sized, H: Hasher>(h: &mut H, v: &T) {
    v.hash(h);
}
