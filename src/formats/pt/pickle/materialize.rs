//! The arena graph turned into a [`Value`] tree, iteratively and under a budget.

use super::*;

impl Unpickler<'_, '_, '_> {
    // ------------------------------------------------------------ arena → Value

    /// Turn the arena graph under `root` into a tree, iteratively, refusing nesting past
    /// [`MAX_DEPTH`] and more materialised memory than a multiple of the pickle's size
    /// (shared memo references are copied, so a small pickle could otherwise explode).
    pub(super) fn materialize(&mut self, root: Id) -> Result<Value, FormatError> {
        self.shrink_packed();
        let mut budget = self.full_budget();
        self.materialize_in(root, &mut budget)
    }

    /// The expansion budget of the whole pickle.
    pub(super) fn full_budget(&self) -> Budget {
        let len = self.data.len() as u64;
        Budget {
            items: len.saturating_mul(ITEMS_PER_BYTE).saturating_add(1 << 20),
            bytes: len.saturating_mul(BYTES_PER_BYTE).saturating_add(64 << 20),
        }
    }

    /// [`Unpickler::materialize`] spending `budget` (shared by the items a streaming read
    /// hands over one by one, so that together they spend no more than the whole pickle).
    pub(super) fn materialize_in(
        &mut self,
        root: Id,
        budget: &mut Budget,
    ) -> Result<Value, FormatError> {
        struct Frame {
            id: Id,
            next: usize,
            out: Vec<Value>,
        }

        let mut frames: Vec<Frame> = Vec::new();
        let mut current = root;
        loop {
            // Visit `current`: a leaf becomes a value now, a container opens a frame.
            let value = match &self.nodes[current] {
                Node::List(v) | Node::Tuple(v) => Some(v.len()),
                Node::Dict(d) => Some(d.items.len() * 2),
                _ => None,
            };
            let leaf = match value {
                Some(n) => {
                    self.charge(budget, 0)?;
                    if frames.len() >= MAX_DEPTH {
                        return Err(
                            self.err(format!("containers nested deeper than {MAX_DEPTH} levels"))
                        );
                    }
                    frames.push(Frame {
                        id: current,
                        next: 0,
                        out: Vec::with_capacity(n),
                    });
                    None
                }
                None => Some(self.leaf(current, budget)?),
            };
            if let Some(v) = leaf {
                match frames.last_mut() {
                    Some(f) => f.out.push(v),
                    None => return Ok(v),
                }
            }
            // Find the next child to visit, closing finished frames.
            loop {
                let Some(f) = frames.last_mut() else {
                    return Err(self.err("internal: no value produced"));
                };
                let child = match &self.nodes[f.id] {
                    Node::List(v) | Node::Tuple(v) => v.get(f.next).copied(),
                    Node::Dict(d) => {
                        d.items
                            .get(f.next / 2)
                            .map(|&(k, v)| if f.next % 2 == 0 { k } else { v })
                    }
                    _ => None,
                };
                if let Some(c) = child {
                    f.next += 1;
                    current = c;
                    break;
                }
                let Some(done) = frames.pop() else {
                    return Err(self.err("internal: frame stack empty"));
                };
                let v = match &self.nodes[done.id] {
                    Node::Tuple(_) => Value::Tuple(done.out),
                    Node::Dict(_) => {
                        let mut it = done.out.into_iter();
                        let mut items = Vec::with_capacity(it.len() / 2);
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            items.push((k, v));
                        }
                        Value::Dict(items)
                    }
                    _ => Value::List(done.out),
                };
                match frames.last_mut() {
                    Some(p) => p.out.push(v),
                    None => return Ok(v),
                }
            }
        }
    }

    /// Spend one value and `heap` bytes of the expansion budget.
    fn charge(&self, budget: &mut Budget, heap: u64) -> Result<(), FormatError> {
        match (budget.items.checked_sub(1), budget.bytes.checked_sub(heap)) {
            (Some(i), Some(b)) => {
                budget.items = i;
                budget.bytes = b;
                Ok(())
            }
            _ => Err(self.err(format!(
                "pickle of {} bytes expands to too many objects (shared references repeated \
                 beyond any real torch.save output)",
                self.data.len()
            ))),
        }
    }

    /// Spend `n` values of the expansion budget (the elements of a packed list).
    fn charge_items(&self, budget: &mut Budget, n: u64) -> Result<(), FormatError> {
        match budget.items.checked_sub(n) {
            Some(i) => {
                budget.items = i;
                Ok(())
            }
            None => self.charge(&mut Budget { items: 0, bytes: 0 }, 1),
        }
    }

    fn leaf(&self, id: Id, budget: &mut Budget) -> Result<Value, FormatError> {
        let (v, extra) = match &self.nodes[id] {
            Node::None => (Value::None, 0),
            Node::Bool(b) => (Value::Bool(*b), 0),
            Node::Int(i) => (Value::Int(*i), 0),
            Node::BigInt(s) => (Value::BigInt(s.clone()), s.len()),
            Node::Float(f) => (Value::Float(*f), 0),
            Node::Str(s) => (Value::Str(s.clone()), s.len()),
            Node::Bytes(b) => (Value::Bytes(b.clone()), b.len()),
            Node::Tensor(t) => (Value::Tensor((**t).clone()), t.ndim() * 16),
            // Shared, not copied; but each reference still spends one item per element,
            // as a list of values would, so that a small pickle repeating a memo
            // reference cannot stand for a huge tree (`to_tensor` would expand it).
            Node::Packed(p) => {
                self.charge_items(budget, p.len().saturating_sub(1) as u64)?;
                (Value::Packed(p.clone()), 0)
            }
            Node::Kept(v) => ((**v).clone(), 0),
            Node::Released => {
                return Err(self.err(
                    "part of an item handed over by a streaming read is referenced again \
                     (a shared object): read the file whole",
                ))
            }
            Node::Storage(st) => {
                let StorageNode { bytes, dtype, key } = &**st;
                let n = bytes.len() / dtype.size();
                let t = Tensor::from_parts(
                    *dtype,
                    vec![n],
                    vec![1],
                    0,
                    bytes.clone(),
                    Some(key.clone()),
                )
                .map_err(|e| self.err(format!("storage {key}: {e}")))?;
                (Value::Tensor(t), 16)
            }
            // A torch.dtype or qscheme object as a value reads as its name, as `str()` prints it.
            Node::Global(Global::Dtype(_) | Global::QScheme, name) => {
                (Value::Str(name.to_string()), name.len())
            }
            Node::Global(_, name) => {
                return Err(self.err(format!("global {name} appears as a value, not data")))
            }
            Node::NumpyDtype { .. } => {
                return Err(self.err("a numpy.dtype appears as a value, not data"))
            }
            Node::NdArrayStub => {
                return Err(self.err("a numpy.ndarray without its data (no BUILD)"))
            }
            Node::List(_) | Node::Tuple(_) | Node::Dict(_) => {
                return Err(self.err("internal: container visited as a leaf"))
            }
        };
        self.charge(budget, extra as u64)?;
        Ok(v)
    }
}

/// Values a pickle may materialise per byte of its length. A value written out costs at
/// least one opcode byte, a memo reference (BINGET) two; more means repeated sharing.
const ITEMS_PER_BYTE: u64 = 2;

/// Heap bytes (strings, bytes, tensor headers) a pickle may materialise per byte of its
/// length; repeated memo references to one long string are what this bounds.
const BYTES_PER_BYTE: u64 = 16;

/// What materialisation may still spend.
pub(super) struct Budget {
    items: u64,
    bytes: u64,
}
