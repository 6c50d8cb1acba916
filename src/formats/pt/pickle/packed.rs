//! Packed lists: a pickled list of ints, floats or bools (the `MARK … APPENDS` batches
//! `torch.save`'s pickler writes, 1000 items a batch) kept as one typed array instead of one
//! node per item, so a trajectory pickle of token lists reads in a few bytes per token.

use std::sync::Arc;

use super::decode::long_from_le;
use super::*;
use crate::value::{Ints, Packed};

impl Unpickler<'_, '_, '_> {
    /// Called at a MARK: when the list on top of the stack is empty or packed and the
    /// batch that follows (`MARK x1 … xn APPENDS`, how the pickler writes a list, 1000
    /// items a batch) holds only ints (BININT1/BININT2/BININT/LONG1), only floats
    /// (BINFLOAT) or only bools (NEWTRUE/NEWFALSE) of the list's own kind, append them
    /// packed, consume the batch and return true. Otherwise leave input and list as
    /// they were and return false: the batch is read the ordinary way.
    pub(super) fn packed_appends(&mut self) -> bool {
        let Some(&list) = self.stack.last() else {
            return false;
        };
        let kind = match &self.nodes[list] {
            Node::List(v) if v.is_empty() => None,
            Node::Packed(p) => Some(match **p {
                Packed::Ints(_) => Kind::Ints,
                Packed::Floats(_) => Kind::Floats,
                Packed::Bools(_) => Kind::Bools,
            }),
            _ => return false,
        };
        // The ints of a batch are decoded into one reused buffer (no allocation a batch).
        let mut ints = std::mem::take(&mut self.scratch);
        ints.clear();
        let Some((batch, end)) = scan_batch(self.data, self.pos, kind, ints) else {
            return false;
        };
        let appended = match (&mut self.nodes[list], &batch) {
            (_, None) => true,
            (Node::List(_), Some(b)) => {
                let mut p = match b {
                    Batch::Ints(_) => Packed::Ints(Ints::default()),
                    Batch::Floats(_) => Packed::Floats(Vec::new()),
                    Batch::Bools(_) => Packed::Bools(Vec::new()),
                };
                append_batch(&mut p, b);
                self.nodes[list] = Node::Packed(Arc::new(p));
                true
            }
            (Node::Packed(p), Some(b)) => match Arc::get_mut(p) {
                Some(p) => {
                    append_batch(p, b);
                    true
                }
                None => false,
            },
            _ => false,
        };
        if let Some(Batch::Ints(v)) = batch {
            self.scratch = v;
        }
        if !appended {
            return false;
        }
        self.pos = end;
        self.depth[list] = self.depth[list].max(1);
        true
    }

    /// APPEND (protocol 0, one item at a time) of scalar `item` to `list`, when `list` is
    /// empty or packed of `item`'s kind: `item` joins the packed array and, when the stack
    /// alone referenced it, leaves the arena. False (nothing done) otherwise.
    pub(super) fn append_packed(&mut self, list: Id, item: Id) -> bool {
        let value = match self.nodes[item] {
            Node::Int(i) => Scalar::Int(i),
            Node::Float(f) => Scalar::Float(f),
            Node::Bool(b) => Scalar::Bool(b),
            _ => return false,
        };
        match &mut self.nodes[list] {
            Node::List(v) if v.is_empty() => {
                let mut p = match value {
                    Scalar::Int(_) => Packed::Ints(Ints::default()),
                    Scalar::Float(_) => Packed::Floats(Vec::new()),
                    Scalar::Bool(_) => Packed::Bools(Vec::new()),
                };
                push_scalar(&mut p, value);
                self.nodes[list] = Node::Packed(Arc::new(p));
            }
            Node::Packed(p) => {
                let fits = matches!(
                    (&**p, value),
                    (Packed::Ints(_), Scalar::Int(_))
                        | (Packed::Floats(_), Scalar::Float(_))
                        | (Packed::Bools(_), Scalar::Bool(_))
                );
                if !fits {
                    return false;
                }
                push_scalar(Arc::make_mut(p), value);
            }
            _ => return false,
        }
        self.depth[list] = self.depth[list].max(1);
        self.drop_tail(&[item]);
        true
    }

    /// LIST (`MARK x1 … xn LIST`, protocols 0-1) of scalars all of one kind: a new packed
    /// list, the items leaving the arena when the stack alone referenced them. `None`
    /// (nothing done) when `items` is empty or not so.
    pub(super) fn packed_list(&mut self, items: &[Id]) -> Option<Id> {
        let first = items.first()?;
        let mut p = match self.nodes[*first] {
            Node::Int(_) => Packed::Ints(Ints::default()),
            Node::Float(_) => Packed::Floats(Vec::new()),
            Node::Bool(_) => Packed::Bools(Vec::new()),
            _ => return None,
        };
        for &c in items {
            let v = match (&p, &self.nodes[c]) {
                (Packed::Ints(_), Node::Int(i)) => Scalar::Int(*i),
                (Packed::Floats(_), Node::Float(f)) => Scalar::Float(*f),
                (Packed::Bools(_), Node::Bool(b)) => Scalar::Bool(*b),
                _ => return None,
            };
            push_scalar(&mut p, v);
        }
        p.shrink_to_fit();
        self.drop_tail(items);
        let id = self.add(Node::Packed(Arc::new(p)));
        self.depth[id] = 1;
        Some(id)
    }

    /// Remove `ids` from the arena when they are its last nodes, in order, and neither
    /// memoized nor duplicated since (so nothing but the stack they were popped from
    /// referenced them: containers only ever hold older nodes).
    fn drop_tail(&mut self, ids: &[Id]) {
        let n = self.nodes.len();
        let Some(start) = n.checked_sub(ids.len()) else {
            return;
        };
        let last = ids.iter().enumerate().all(|(i, &c)| c == start + i);
        let unshared = ids.first().is_some_and(|&c| {
            self.memo_max.is_none_or(|m| m < c) && self.dup_max.is_none_or(|m| m < c)
        });
        if last && unshared {
            self.nodes.truncate(start);
            self.depth.truncate(start);
        }
    }

    /// Append the scalars `items` to packed list `list` when every one is of its kind;
    /// false (nothing appended) otherwise.
    pub(super) fn push_packed(&mut self, list: Id, items: &[Id]) -> bool {
        let nodes = &self.nodes;
        let Node::Packed(p) = &nodes[list] else {
            return false;
        };
        let fits = items.iter().all(|&c| {
            matches!(
                (&**p, &nodes[c]),
                (Packed::Ints(_), Node::Int(_))
                    | (Packed::Floats(_), Node::Float(_))
                    | (Packed::Bools(_), Node::Bool(_))
            )
        });
        if !fits {
            return false;
        }
        let values: Vec<Scalar> = items
            .iter()
            .filter_map(|&c| match nodes[c] {
                Node::Int(i) => Some(Scalar::Int(i)),
                Node::Float(f) => Some(Scalar::Float(f)),
                Node::Bool(b) => Some(Scalar::Bool(b)),
                _ => None,
            })
            .collect();
        let Node::Packed(p) = &mut self.nodes[list] else {
            return false;
        };
        let p = Arc::make_mut(p);
        for v in values {
            push_scalar(p, v);
        }
        true
    }

    /// Turn packed list `id` back into a list of item nodes (a batch of another kind is
    /// being appended, or a call needs its items as nodes).
    pub(super) fn unpack(&mut self, id: Id) {
        let Node::Packed(p) = &self.nodes[id] else {
            return;
        };
        let p = p.clone();
        let items: Vec<Id> = match &*p {
            Packed::Ints(v) => v.iter().map(|x| self.add(Node::Int(x))).collect(),
            Packed::Floats(v) => v.iter().map(|&x| self.add(Node::Float(x))).collect(),
            Packed::Bools(v) => v.iter().map(|&x| self.add(Node::Bool(x))).collect(),
        };
        self.nodes[id] = Node::List(items);
    }

    /// Unpack the packed lists among the arguments of a call, so that the interpreted
    /// globals only ever see item nodes.
    pub(super) fn unpack_args(&mut self, args: Id) {
        if let Node::Tuple(v) = &self.nodes[args] {
            let packed: Vec<Id> = v
                .iter()
                .copied()
                .filter(|&c| matches!(self.nodes[c], Node::Packed(_)))
                .collect();
            for c in packed {
                self.unpack(c);
            }
        }
    }

    /// Release the spare capacity packed lists kept from growing.
    pub(super) fn shrink_packed(&mut self) {
        for n in &mut self.nodes {
            if let Node::Packed(p) = n {
                if let Some(p) = Arc::get_mut(p) {
                    p.shrink_to_fit();
                }
            }
        }
    }
}

/// One scalar item of a list batch.
#[derive(Clone, Copy)]
enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// Append `v` to `p`, which is of its kind (checked by the caller).
fn push_scalar(p: &mut Packed, v: Scalar) {
    match (p, v) {
        (Packed::Ints(x), Scalar::Int(i)) => x.push(i),
        (Packed::Floats(x), Scalar::Float(f)) => x.push(f),
        (Packed::Bools(x), Scalar::Bool(b)) => x.push(b),
        _ => {}
    }
}

/// The kind of items a packed list holds.
#[derive(Clone, Copy)]
enum Kind {
    Ints,
    Floats,
    Bools,
}

/// The items of one list batch, decoded.
enum Batch {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
}

/// Append a decoded batch to a packed list of its kind (checked by the caller).
fn append_batch(p: &mut Packed, b: &Batch) {
    match (p, b) {
        (Packed::Ints(x), Batch::Ints(b)) => x.extend_from_i64(b),
        (Packed::Floats(x), Batch::Floats(b)) => {
            if x.len() + b.len() <= 1 << 16 {
                x.reserve_exact(b.len());
            }
            x.extend_from_slice(b);
        }
        (Packed::Bools(x), Batch::Bools(b)) => {
            if x.len() + b.len() <= 1 << 16 {
                x.reserve_exact(b.len());
            }
            x.extend_from_slice(b);
        }
        _ => {}
    }
}

/// Decode the scalar items of a list batch from `data[pos..]` up to its APPENDS, all of
/// `kind` (or of the first item's kind when `kind` is `None`; a batch of ints fills the
/// buffer `ints`). Returns the batch (`None` for `MARK APPENDS` with nothing between) and
/// the offset after the APPENDS; `None` at the first opcode that is anything else,
/// truncation included.
fn scan_batch(
    data: &[u8],
    mut pos: usize,
    kind: Option<Kind>,
    ints: Vec<i64>,
) -> Option<(Option<Batch>, usize)> {
    let kind = match kind {
        Some(k) => k,
        None => match scan_item(data, skip_frames(data, pos))? {
            Item::End(end) => return Some((None, end)),
            Item::Scalar(Scalar::Int(_), _) => Kind::Ints,
            Item::Scalar(Scalar::Float(_), _) => Kind::Floats,
            Item::Scalar(Scalar::Bool(_), _) => Kind::Bools,
        },
    };
    let mut batch = match kind {
        Kind::Ints => Batch::Ints(ints),
        Kind::Floats => Batch::Floats(Vec::new()),
        Kind::Bools => Batch::Bools(Vec::new()),
    };
    if let Batch::Ints(xs) = &mut batch {
        xs.reserve(1000);
    }
    loop {
        if let Batch::Ints(xs) = &mut batch {
            // The hot path (token ids as torch.save's protocol-2 pickler writes them): the
            // binary int opcodes in tight loops; anything else goes to `scan_item`.
            pos = scan_binints(data, pos, xs);
        }
        if let Batch::Bools(xs) = &mut batch {
            // A mask of Python bools: NEWTRUE / NEWFALSE, one byte each.
            let rest = data.get(pos..).unwrap_or_default();
            let run = rest.iter().take_while(|&&b| b == 0x88 || b == 0x89).count();
            xs.extend(rest[..run].iter().map(|&b| b == 0x88));
            pos += run;
        }
        let at = skip_frames(data, pos);
        if at != pos {
            pos = at;
            continue;
        }
        match (scan_item(data, pos)?, &mut batch) {
            (Item::End(end), _) => return Some((Some(batch), end)),
            (Item::Scalar(Scalar::Int(v), next), Batch::Ints(xs)) => {
                xs.push(v);
                pos = next;
            }
            (Item::Scalar(Scalar::Float(v), next), Batch::Floats(xs)) => {
                xs.push(v);
                pos = next;
            }
            (Item::Scalar(Scalar::Bool(v), next), Batch::Bools(xs)) => {
                xs.push(v);
                pos = next;
            }
            _ => return None,
        }
    }
}

/// Length (opcode byte included) of a binary int opcode: BININT1 `K` 2, BININT2 `M` 3,
/// BININT `J` 5; 0 for every other opcode. Arithmetic rather than a table, so that finding
/// the next opcode costs no memory load.
#[inline(always)]
fn binint_len(op: u8) -> usize {
    2 * usize::from(op == b'K') + 3 * usize::from(op == b'M') + 5 * usize::from(op == b'J')
}

/// The int a binary int opcode of length `len` (from [`binint_len`], not 0) pushes, from
/// the (at least) 4 little-endian bytes after it, `arg`: its 1, 2 or 4 bytes, BININT's
/// signed (BININT1 and BININT2 stay below 2^16, which the sign extension leaves as is).
#[inline(always)]
fn binint_value(len: usize, arg: u32) -> i64 {
    let shift = 8 * (5 - len as u32);
    i64::from(((arg << shift) >> shift) as i32)
}

/// The arguments of the eight BININT1 opcodes `w` holds when its 16 bytes are that (a run
/// of a mask), checked in two words.
#[inline(always)]
fn eight_binint1(w: &[u8]) -> Option<[i64; 8]> {
    const OPS: u64 = 0x00ff_00ff_00ff_00ff;
    const KS: u64 = 0x004b_004b_004b_004b; // b'K' at every even byte
    let w: [u8; 16] = w.try_into().ok()?;
    let words = u128::from_le_bytes(w);
    let (lo, hi) = (words as u64, (words >> 64) as u64);
    (lo & OPS == KS && hi & OPS == KS)
        .then(|| [w[1], w[3], w[5], w[7], w[9], w[11], w[13], w[15]].map(i64::from))
}

/// Decode the binary int opcodes (BININT1 `K`, BININT2 `M`, BININT `J`) from `data[pos..]`
/// into `xs` up to the first other opcode (or fewer than 5 bytes left: `scan_item` reads
/// those); return its offset. Each opcode's offset depends on the one before: a run of
/// BININT1s (a mask) is checked eight at a time in two words; otherwise (token ids, the
/// opcodes mixed) three opcodes are decoded from one 16-byte window held in a register,
/// each next offset found without a load or a branch on the opcode.
fn scan_binints(data: &[u8], mut pos: usize, xs: &mut Vec<i64>) -> usize {
    loop {
        while let Some(v) = data.get(pos..pos + 16).and_then(eight_binint1) {
            xs.extend_from_slice(&v);
            pos += 16;
        }
        for _ in 0..4 {
            let Some(w) = data
                .get(pos..pos + 16)
                .and_then(|w| <[u8; 16]>::try_from(w).ok())
            else {
                return scan_binints_tail(data, pos, xs);
            };
            let w = u128::from_le_bytes(w);
            // Three opcodes of at most 5 bytes each end within the 16.
            let mut off = 0;
            for _ in 0..3 {
                let len = binint_len((w >> (8 * off)) as u8);
                if len == 0 {
                    return pos + off;
                }
                xs.push(binint_value(len, (w >> (8 * off + 8)) as u32));
                off += len;
            }
            pos += off;
        }
    }
}

/// [`scan_binints`] of the last bytes of the pickle (fewer than 16 left), one opcode at a
/// time.
fn scan_binints_tail(data: &[u8], mut pos: usize, xs: &mut Vec<i64>) -> usize {
    while let Some(&[op, a, b, c, d]) = data.get(pos..pos + 5) {
        let len = binint_len(op);
        if len == 0 {
            break;
        }
        xs.push(binint_value(len, u32::from_le_bytes([a, b, c, d])));
        pos += len;
    }
    pos
}

/// The offset past any protocol-4 FRAMEs (opcode and 8-byte length) at `data[pos]`. One
/// falls every ~64 KB, in the middle of a batch as often as not: it only marks where the
/// pickler flushed its buffer, and the main loop skips it too.
fn skip_frames(data: &[u8], mut pos: usize) -> usize {
    while data.get(pos) == Some(&0x95) && data.len() >= pos + 9 {
        pos += 9;
    }
    pos
}

/// One opcode of a list batch: a scalar and the offset after it, or the closing APPENDS
/// and the offset after it.
enum Item {
    Scalar(Scalar, usize),
    End(usize),
}

/// Decode the opcode at `data[pos]` when it pushes an int, float or bool exactly as the
/// main loop would (binary: BININT1/BININT2/BININT/LONG1 up to 8 bytes, BINFLOAT,
/// NEWTRUE/NEWFALSE; text, protocols 0-1: INT and LONG within i64, `I01`/`I00` bools,
/// FLOAT) or is APPENDS; `None` for anything else, truncation included.
fn scan_item(data: &[u8], pos: usize) -> Option<Item> {
    let int = |v: i64, next: usize| Some(Item::Scalar(Scalar::Int(v), next));
    match *data.get(pos)? {
        b'K' => int(*data.get(pos + 1)? as i64, pos + 2),
        b'M' => {
            let b = data.get(pos + 1..pos + 3)?;
            int(u16::from_le_bytes([b[0], b[1]]) as i64, pos + 3)
        }
        b'J' => {
            let b = data.get(pos + 1..pos + 5)?;
            int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64, pos + 5)
        }
        0x8a => {
            let n = *data.get(pos + 1)? as usize;
            let b = data.get(pos + 2..pos + 2 + n).filter(|_| n <= 8)?;
            match long_from_le(b) {
                Node::Int(i) => int(i, pos + 2 + n),
                _ => None,
            }
        }
        b'G' => {
            let b: [u8; 8] = data.get(pos + 1..pos + 9)?.try_into().ok()?;
            Some(Item::Scalar(Scalar::Float(f64::from_be_bytes(b)), pos + 9))
        }
        0x88 => Some(Item::Scalar(Scalar::Bool(true), pos + 1)),
        0x89 => Some(Item::Scalar(Scalar::Bool(false), pos + 1)),
        op @ (b'I' | b'L' | b'F') => {
            let (line, next) = text_arg(data, pos + 1)?;
            let item = match (op, line) {
                (b'I', "00") => Scalar::Bool(false),
                (b'I', "01") => Scalar::Bool(true),
                (b'I', _) => Scalar::Int(line.trim().parse().ok()?),
                (b'L', _) => Scalar::Int(line.trim_end_matches('L').trim().parse().ok()?),
                _ => Scalar::Float(line.trim().parse().ok()?),
            };
            Some(Item::Scalar(item, next))
        }
        b'e' => Some(Item::End(pos + 1)),
        _ => None,
    }
}

/// The text argument starting at `data[pos]` as the main loop reads it (up to the newline,
/// UTF-8, a trailing `\r` dropped) and the offset after its newline.
fn text_arg(data: &[u8], pos: usize) -> Option<(&str, usize)> {
    let rest = data.get(pos..)?;
    let n = memchr::memchr(b'\n', rest)?;
    let s = std::str::from_utf8(&rest[..n]).ok()?;
    Some((s.trim_end_matches('\r'), pos + n + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: each binary int opcode decoded on its own, its argument read from
    /// exactly its bytes (BININT1 1, BININT2 2 unsigned, BININT 4 signed), up to the first
    /// other opcode or a truncated one; the offset there.
    fn one_at_a_time(data: &[u8], mut pos: usize, xs: &mut Vec<i64>) -> usize {
        loop {
            let arg = |n: usize| data.get(pos + 1..pos + 1 + n);
            match data.get(pos) {
                Some(b'K') if arg(1).is_some() => {
                    xs.push(i64::from(data[pos + 1]));
                    pos += 2;
                }
                Some(b'M') if arg(2).is_some() => {
                    xs.push(i64::from(u16::from_le_bytes([
                        data[pos + 1],
                        data[pos + 2],
                    ])));
                    pos += 3;
                }
                Some(b'J') if arg(4).is_some() => {
                    let b = &data[pos + 1..pos + 5];
                    xs.push(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                    pos += 5;
                }
                _ => return pos,
            }
        }
    }

    /// Random opcode streams: runs of BININT1/BININT2/BININT with random arguments (bytes
    /// that read as `K`, `M`, `J`, FRAME or APPENDS included), BININT1 runs of 0/1 as masks
    /// write them, ended by APPENDS or another opcode, from random offsets.
    #[test]
    fn the_window_decoder_decodes_as_one_opcode_at_a_time() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let specials = [b'K', b'M', b'J', b'e', 0x95, 0x80, 0xff, 0x00];
        let mut checked = 0;
        for round in 0..4000 {
            let mut data = Vec::new();
            // Some bytes before the start.
            let lead = next(8) as usize;
            data.extend((0..lead).map(|_| next(256) as u8));
            let ops = next(if round % 10 == 0 { 2000 } else { 60 }) as usize;
            let mask_run = round % 7 == 0;
            for _ in 0..ops {
                let arg = |next: &mut dyn FnMut(u64) -> u64| -> u8 {
                    if next(4) == 0 {
                        specials[next(specials.len() as u64) as usize]
                    } else {
                        next(256) as u8
                    }
                };
                match if mask_run { 0 } else { next(3) } {
                    0 => {
                        data.push(b'K');
                        data.push(if mask_run {
                            next(2) as u8
                        } else {
                            arg(&mut next)
                        });
                    }
                    1 => {
                        data.push(b'M');
                        data.extend([arg(&mut next), arg(&mut next)]);
                    }
                    _ => {
                        data.push(b'J');
                        data.extend([arg(&mut next), arg(&mut next), arg(&mut next)]);
                        data.push(arg(&mut next));
                    }
                }
            }
            // The end: APPENDS, a FRAME, another opcode, or nothing (truncated).
            match next(4) {
                0 => data.push(b'e'),
                1 => data.extend([0x95, 9, 0, 0, 0, 0, 0, 0, 0]),
                2 => data.push(b'('),
                _ => {}
            }
            data.extend((0..next(80)).map(|_| next(256) as u8));
            for start in [lead, lead + 1] {
                let (mut a, mut b) = (vec![7], vec![7]);
                // The window decoder leaves the last few bytes to its caller: finished
                // one opcode at a time, it ends where the reference does, with its ints.
                let pa = scan_binints(&data, start, &mut a);
                checked += a.len();
                let pa = one_at_a_time(&data, pa, &mut a);
                let pb = one_at_a_time(&data, start, &mut b);
                assert_eq!((pa, &a), (pb, &b), "round {round}, start {start}");
            }
        }
        assert!(checked > 100_000, "{checked}");
    }
}
