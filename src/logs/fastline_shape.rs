//! The shape of a JSON step line, replayed on the lines after it (for [`super`], the
//! JSON-line fast path).
//!
//! The lines of one log repeat their keys, nesting and spacing; only the values change. A
//! line the full scan accepted is kept as its shape: the bytes between its leaf values
//! (`{"step": `, `, "train_loss": `, …, `}}`), each leaf's path and special slot, and the
//! top-level objects. The next line is read by comparing those bytes and reading only
//! the values, with the same value reader as the full scan ([`super::leaf_value`]). A
//! line whose bytes between the values equal the shape's has the same keys in the same
//! objects, so it yields exactly what the full scan would yield (the same leaves, paths,
//! special slots); anything else (another key, spacing, an object where a value was) is
//! not a match, and the full scan reads the line and makes it the new shape.

use super::{leaf_value, Scan, Scratch, Top};

/// What the full scan knew about one leaf that a replay needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct LeafMeta {
    /// Byte range of the value in its line.
    pub span: (u32, u32),
    /// Depth of the object holding it (lists below it are skipped from `depth + 1`).
    pub depth: u32,
    /// It is a top-level special key's value (its slot gets the value).
    pub is_top: bool,
    /// Position in `TIME_KEYS` of a `data`-level time key, or `u8::MAX`.
    pub dtime: u8,
}

/// One line's shape.
#[derive(Debug, Default)]
pub(super) struct Shape {
    /// Changes whenever a new shape is recorded (0: none yet), so batches know when
    /// their cached key ids stop applying.
    pub gen: u64,
    /// A shape to replay was recorded.
    valid: bool,
    /// The line the shape was taken from.
    bytes: Vec<u8>,
    /// Ranges of `bytes` between the values: one before each leaf, one after the last.
    lits: Vec<(u32, u32)>,
    /// Per leaf: path range in `all`, start of the part below the top-level key, special
    /// slot, and its [`LeafMeta`].
    leaves: Vec<(u32, u32, u32, u8, LeafMeta)>,
    /// Top-level special slots whose value is an object.
    top_dicts: Vec<u8>,
    /// The leaves' paths, back to back.
    pub all: String,
}

/// `rest.starts_with(lit)`, compared 8 bytes at a time in place: the literals between
/// values are short (`, "train_loss": `), where a call to `memcmp` costs more than the
/// compare.
#[inline(always)]
fn starts_with(rest: &[u8], lit: &[u8]) -> bool {
    let Some(head) = rest.get(..lit.len()) else {
        return false;
    };
    let mut a = head.chunks_exact(8);
    let mut b = lit.chunks_exact(8);
    for (x, y) in (&mut a).zip(&mut b) {
        if u64::from_ne_bytes(x.try_into().unwrap_or_default())
            != u64::from_ne_bytes(y.try_into().unwrap_or_default())
        {
            return false;
        }
    }
    a.remainder().iter().zip(b.remainder()).all(|(x, y)| x == y)
}

/// Keep the line the full scan just read (`sc`'s leaves, meta, paths) as the shape.
pub(super) fn record(line: &str, sc: &mut Scratch) {
    let sh = &mut sc.shape;
    sh.gen += 1;
    sh.valid = !sc.no_shape && sc.leaves.len() == sc.meta.len();
    sh.bytes.clear();
    sh.lits.clear();
    sh.leaves.clear();
    if !sh.valid {
        return;
    }
    sh.bytes.extend_from_slice(line.as_bytes());
    let mut prev = 0u32;
    for (&(a, z, rel, slot, _), m) in sc.leaves.iter().zip(&sc.meta) {
        sh.lits.push((prev, m.span.0));
        prev = m.span.1;
        sh.leaves.push((a, z, rel, slot, *m));
    }
    sh.lits.push((prev, line.len() as u32));
    sh.top_dicts.clone_from(&sc.top_dicts);
    sh.all.clone_from(&sc.all);
}

/// Read `line` as the shape's: fills `sc`'s leaves (paths in the shape's `all`), top
/// slots and `data` times and returns true, or false when the line is not of the shape
/// (the caller then runs the full scan, which resets what this left).
pub(super) fn replay(line: &str, sc: &mut Scratch) -> bool {
    let sh = &sc.shape;
    if !sh.valid {
        return false;
    }
    let bytes = line.as_bytes();
    let mut s = Scan {
        text: line,
        b: bytes,
        i: 0,
    };
    sc.leaves.clear();
    sc.top = [None; 13];
    sc.data_time = [None; 3];
    for &slot in &sh.top_dicts {
        sc.top[slot as usize] = Some(Top::Dict);
    }
    let lit = |k: usize| {
        let (a, z) = sh.lits[k];
        &sh.bytes[a as usize..z as usize]
    };
    for (k, &(a, z, rel, slot, m)) in sh.leaves.iter().enumerate() {
        let l = lit(k);
        if !bytes.get(s.i..).is_some_and(|rest| starts_with(rest, l)) {
            return false;
        }
        s.i += l.len();
        let Some(&c) = bytes.get(s.i) else {
            return false;
        };
        let Some((leaf, top)) = leaf_value(&mut s, c, m.depth) else {
            return false;
        };
        if m.is_top {
            sc.top[slot as usize] = Some(top);
        }
        if m.dtime != u8::MAX && sc.data_time[m.dtime as usize].is_none() {
            sc.data_time[m.dtime as usize] = Some(top);
        }
        sc.leaves.push((a, z, rel, slot, leaf));
    }
    let l = lit(sh.leaves.len());
    bytes.get(s.i..) == Some(l)
}
