//! A small explicit-state model checker: breadth-first over every action
//! sequence, visited states kept as 64-bit fingerprints of their canonical
//! identity; `always` properties checked on every state, `eventually`
//! properties on every final state (one with no action left), and liveness
//! under fair scheduling: from every reachable state, a path of fair steps
//! (no more faults) reaches a goal state. Counterexamples are the shortest
//! action sequence.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A system the checker explores.
pub trait Model: Clone {
    /// One step of the system or its environment.
    type Action: Clone + Debug;
    /// Every action possible in this state.
    fn actions(&self, out: &mut Vec<Self::Action>);
    /// The state after `action`.
    fn next(&self, action: &Self::Action) -> Self;
    /// The state's identity (what must be equal for two states to be the
    /// same, up to symmetry).
    fn identity<H: Hasher>(&self, h: &mut H);
    /// A broken `always` property, if any.
    fn always(&self) -> Option<String>;
    /// A broken `eventually` property, checked when no action is left.
    fn eventually(&self) -> Option<String>;
    /// Whether `action` is a fair step of the system (not a fault the
    /// environment may stop making).
    fn fair(&self, action: &Self::Action) -> bool;
    /// Whether this state is where liveness is satisfied.
    fn goal(&self) -> bool;
    /// Why a state that cannot reach a goal state is stuck, readably.
    fn stuck(&self) -> String;
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

/// FxHash's multiply-rotate over 64-bit words: fingerprints of identities
/// (a few hundred bytes each) at a fraction of SipHash's cost.
#[derive(Default, Clone, Copy)]
pub struct Fx(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Fx {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut it = bytes.chunks_exact(8);
        for c in &mut it {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
        }
        let rest = it.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // A final avalanche (murmur3's), so that the table's low bits vary.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

/// A table keyed by fingerprints, which are hashes already.
#[derive(Default)]
struct Ident(u64);

impl Hasher for Ident {
    fn write(&mut self, _: &[u8]) {}
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn fingerprint<M: Model>(m: &M) -> u64 {
    let mut h = Fx::default();
    m.identity(&mut h);
    h.finish()
}

/// Explores every state reachable from `init` (at most `limit`: a larger
/// space is reported as a violation, never silently cut).
pub fn check<M: Model>(init: M, limit: usize) -> Report {
    let mut seen: HashMap<u64, u32, BuildHasherDefault<Ident>> =
        HashMap::with_capacity_and_hasher(1 << 16, Default::default());
    // Per state: its parent and the action from it, to rebuild paths.
    let mut parents: Vec<(u32, Option<M::Action>)> = Vec::with_capacity(1 << 16);
    // Per state: whether it is a goal; the fair edges (from, to).
    let mut goal: Vec<bool> = Vec::with_capacity(1 << 16);
    let mut fair: Vec<(u32, u32)> = Vec::with_capacity(1 << 18);
    let mut queue: VecDeque<(M, u32, u32)> = VecDeque::new();
    seen.insert(fingerprint(&init), 0);
    parents.push((0, None));
    goal.push(init.goal());
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
        (out, s)
    };
    let found = |states: usize, finals, what: String, path: Vec<String>, depth| Report {
        states,
        finals,
        violation: Some((what, path)),
        depth,
    };
    if let Some(v) = init.always() {
        return found(1, 0, v, vec![], 0);
    }
    while let Some((state, idx, d)) = queue.pop_front() {
        depth = depth.max(d as usize);
        actions.clear();
        state.actions(&mut actions);
        if actions.is_empty() {
            finals += 1;
            if let Some(v) = state.eventually() {
                let (p, _) = path(&parents, idx);
                return found(seen.len(), finals, format!("eventually: {v}"), p, depth);
            }
            continue;
        }
        for a in &actions {
            let next = state.next(a);
            let f = fingerprint(&next);
            let i = parents.len() as u32;
            let to = *seen.entry(f).or_insert(i);
            if state.fair(a) {
                fair.push((idx, to));
            }
            if to != i {
                continue;
            }
            parents.push((idx, Some(a.clone())));
            goal.push(next.goal());
            if let Some(v) = next.always() {
                let (p, _) = path(&parents, i);
                return found(seen.len(), finals, format!("always: {v}"), p, depth);
            }
            if seen.len() > limit {
                // The path to the deepest state: what keeps the space growing.
                let what = format!("more than {limit} states");
                let (p, _) = path(&parents, i);
                return found(seen.len(), finals, what, p, depth);
            }
            queue.push_back((next, i, d + 1));
        }
    }
    drop(queue);
    drop(seen);
    // Liveness: every state reaches a goal along fair edges. Backwards from
    // the goals over the reversed fair edges (counting sort by target).
    let n = parents.len();
    let mut start = vec![0u32; n + 1];
    for &(_, to) in &fair {
        start[to as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut from = vec![0u32; fair.len()];
    for &(f, to) in &fair {
        from[fill[to as usize] as usize] = f;
        fill[to as usize] += 1;
    }
    drop(fill);
    drop(fair);
    let mut live = goal;
    let mut todo: Vec<u32> = (0..n as u32).filter(|&i| live[i as usize]).collect();
    while let Some(t) = todo.pop() {
        let t = t as usize;
        for &f in &from[start[t] as usize..start[t + 1] as usize] {
            if !live[f as usize] {
                live[f as usize] = true;
                todo.push(f);
            }
        }
    }
    // The first such state in breadth-first order is a shallowest one.
    if let Some(i) = live.iter().position(|l| !l) {
        let (p, s) = path(&parents, i as u32);
        let what = format!(
            "eventually (fair): no fair path from here ends the batch: {}",
            s.stuck()
        );
        return found(n, finals, what, p, depth);
    }
    Report {
        states: n,
        finals,
        violation: None,
        depth,
    }
}

/// Hashes a value into `h` (shorthand for identities).
pub fn put<T: Hash + ?Sized, H: Hasher>(h: &mut H, v: &T) {
    v.hash(h);
}
