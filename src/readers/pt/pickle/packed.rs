//! Packed lists: a pickled list of ints, floats or bools (the `MARK … APPENDS` batches
//! `torch.save`'s pickler writes, 1000 items a batch) kept as one typed array instead of one
//! node per item, so a trajectory pickle of token lists reads in a few bytes per token.

use std::sync::Arc;

use super::decode::long_from_le;
use super::*;
use crate::value::{Ints, Packed};

impl Unpickler<'_, '_> {
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
                Packed::Ints(_) => Batch::Ints(Vec::new()),
                Packed::Floats(_) => Batch::Floats(Vec::new()),
                Packed::Bools(_) => Batch::Bools(Vec::new()),
            }),
            _ => return false,
        };
        let Some((batch, end)) = scan_batch(self.data, self.pos, kind) else {
            return false;
        };
        match (&mut self.nodes[list], batch) {
            (_, None) => {}
            (Node::List(_), Some(b)) => {
                let mut p = match b {
                    Batch::Ints(_) => Packed::Ints(Ints::default()),
                    Batch::Floats(_) => Packed::Floats(Vec::new()),
                    Batch::Bools(_) => Packed::Bools(Vec::new()),
                };
                append_batch(&mut p, b);
                self.nodes[list] = Node::Packed(Arc::new(p));
            }
            (Node::Packed(p), Some(b)) => match Arc::get_mut(p) {
                Some(p) => append_batch(p, b),
                None => return false,
            },
            _ => return false,
        }
        self.pos = end;
        self.depth[list] = self.depth[list].max(1);
        true
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

/// The items of one list batch, decoded.
enum Batch {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
}

/// Append a decoded batch to a packed list of its kind (checked by the caller).
fn append_batch(p: &mut Packed, b: Batch) {
    match (p, b) {
        (Packed::Ints(x), Batch::Ints(b)) => x.extend_from_i64(&b),
        (Packed::Floats(x), Batch::Floats(b)) => {
            if x.len() + b.len() <= 1 << 16 {
                x.reserve_exact(b.len());
            }
            x.extend_from_slice(&b);
        }
        (Packed::Bools(x), Batch::Bools(b)) => {
            if x.len() + b.len() <= 1 << 16 {
                x.reserve_exact(b.len());
            }
            x.extend_from_slice(&b);
        }
        _ => {}
    }
}

/// Decode the scalar items of a list batch from `data[pos..]` up to its APPENDS, all of
/// `kind`'s kind (or of the first item's when `kind` is `None`). Returns the batch (`None`
/// for `MARK APPENDS` with nothing between) and the offset after the APPENDS; `None` at
/// the first opcode that is anything else, truncation included.
fn scan_batch(data: &[u8], mut pos: usize, kind: Option<Batch>) -> Option<(Option<Batch>, usize)> {
    let kind = match kind {
        Some(k) => k,
        None => match *data.get(pos)? {
            b'K' | b'M' | b'J' | 0x8a => Batch::Ints(Vec::new()),
            b'G' => Batch::Floats(Vec::new()),
            0x88 | 0x89 => Batch::Bools(Vec::new()),
            b'e' => return Some((None, pos + 1)),
            _ => return None,
        },
    };
    match kind {
        Batch::Ints(mut xs) => {
            xs.reserve(1000);
            loop {
                let v = match *data.get(pos)? {
                    b'K' => {
                        let v = *data.get(pos + 1)? as i64;
                        pos += 2;
                        v
                    }
                    b'M' => {
                        let b = data.get(pos + 1..pos + 3)?;
                        pos += 3;
                        u16::from_le_bytes([b[0], b[1]]) as i64
                    }
                    b'J' => {
                        let b = data.get(pos + 1..pos + 5)?;
                        pos += 5;
                        i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64
                    }
                    0x8a => {
                        let n = *data.get(pos + 1)? as usize;
                        let b = data.get(pos + 2..pos + 2 + n).filter(|_| n <= 8)?;
                        pos += 2 + n;
                        match long_from_le(b) {
                            Node::Int(i) => i,
                            _ => return None,
                        }
                    }
                    b'e' => return Some((Some(Batch::Ints(xs)), pos + 1)),
                    _ => return None,
                };
                xs.push(v);
            }
        }
        Batch::Floats(mut xs) => loop {
            match *data.get(pos)? {
                b'G' => {
                    let b: [u8; 8] = data.get(pos + 1..pos + 9)?.try_into().ok()?;
                    pos += 9;
                    xs.push(f64::from_be_bytes(b));
                }
                b'e' => return Some((Some(Batch::Floats(xs)), pos + 1)),
                _ => return None,
            }
        },
        Batch::Bools(mut xs) => loop {
            match *data.get(pos)? {
                0x88 => xs.push(true),
                0x89 => xs.push(false),
                b'e' => return Some((Some(Batch::Bools(xs)), pos + 1)),
                _ => return None,
            }
            pos += 1;
        },
    }
}
