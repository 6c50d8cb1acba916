//! A restricted, iterative unpickler for the `data.pkl` member of `torch.save` archives.
//!
//! It understands the data-only opcodes of pickle protocols 0–5 and a short list of
//! globals (tensor and parameter rebuilders, storages, `OrderedDict`, `torch.Size`, bytes
//! helpers, numpy scalars), which it interprets itself: nothing is ever imported or
//! executed, and any other global is refused by name. Objects live in an arena while the
//! pickle is read (so memo references share mutations as in Python) and are turned into a
//! [`Value`] tree at the end, under a nesting limit and a budget proportional to the
//! pickle's length.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;

use crate::error::{FormatError, Position};
use crate::tensor::{Bytes, DType, Tensor};
use crate::value::{Ints, Packed, Value};

/// Deepest nesting of containers accepted, so that neither reading nor dropping a value
/// can exhaust the stack.
pub const MAX_DEPTH: usize = 512;

/// Longest integer (in bytes of two's complement) accepted by LONG1/LONG4, about the
/// 4300 decimal digits Python itself agrees to print.
const MAX_LONG_BYTES: usize = 1800;

/// Longest decimal integer accepted by the text opcodes INT and LONG.
const MAX_LONG_DIGITS: usize = 4300;

/// Index of a node in the arena.
type Id = usize;

/// The globals this reader accepts; each is a tag that REDUCE interprets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Global {
    RebuildTensorV2,
    RebuildTensor,
    RebuildParameter,
    RebuildParameterWithState,
    OrderedDict,
    Storage(DType),
    Size,
    CodecsEncode,
    Bytes,
    ByteArray,
    Set,
    FrozenSet,
    NumpyScalar,
    NumpyDtype,
    NumpyReconstruct,
    NumpyNdarray,
}

/// The accepted global `module.name`, or `None` when it must be refused.
fn lookup_global(module: &str, name: &str) -> Option<Global> {
    let g = match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_tensor") => Global::RebuildTensor,
        ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Global::RebuildParameterWithState,
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch", "Size") => Global::Size,
        ("torch", "FloatStorage") => Global::Storage(DType::F32),
        ("torch", "DoubleStorage") => Global::Storage(DType::F64),
        ("torch", "HalfStorage") => Global::Storage(DType::F16),
        ("torch", "BFloat16Storage") => Global::Storage(DType::BF16),
        ("torch", "LongStorage") => Global::Storage(DType::I64),
        ("torch", "IntStorage") => Global::Storage(DType::I32),
        ("torch", "ShortStorage") => Global::Storage(DType::I16),
        ("torch", "CharStorage") => Global::Storage(DType::I8),
        ("torch", "ByteStorage") => Global::Storage(DType::U8),
        ("torch", "BoolStorage") => Global::Storage(DType::Bool),
        ("_codecs", "encode") => Global::CodecsEncode,
        ("builtins" | "__builtin__", "bytes") => Global::Bytes,
        ("builtins" | "__builtin__", "bytearray") => Global::ByteArray,
        ("builtins" | "__builtin__", "set") => Global::Set,
        ("builtins" | "__builtin__", "frozenset") => Global::FrozenSet,
        ("numpy.core.multiarray" | "numpy._core.multiarray", "scalar") => Global::NumpyScalar,
        ("numpy", "dtype") => Global::NumpyDtype,
        ("numpy.core.multiarray" | "numpy._core.multiarray", "_reconstruct") => {
            Global::NumpyReconstruct
        }
        ("numpy", "ndarray") => Global::NumpyNdarray,
        _ => return None,
    };
    Some(g)
}

/// A request for the bytes of one storage, made by a persistent id.
#[derive(Debug, Clone)]
pub struct StorageRequest<'a> {
    /// The storage's key (`"0"` for member `data/0`).
    pub key: &'a str,
    /// Element type named by the storage class (`torch.FloatStorage` → f32).
    pub dtype: DType,
    /// Number of elements the pickle claims the storage holds.
    pub numel: u64,
}

/// Hashable identity of a dict key, so that a repeated key replaces its value in place
/// as in Python (`1`, `True` and `1.0` are one key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyRepr {
    None,
    Int(i64),
    BigInt(String),
    Float(u64),
    Str(String),
    Bytes(Vec<u8>),
    Object(Id),
}

/// A dict under construction.
#[derive(Debug, Default)]
struct DictNode {
    items: Vec<(Id, Id)>,
    index: HashMap<KeyRepr, usize>,
}

/// A storage loaded through a persistent id.
#[derive(Debug)]
struct StorageNode {
    bytes: Bytes,
    dtype: DType,
    key: String,
}

/// An object in the arena.
#[derive(Debug)]
enum Node {
    None,
    Bool(bool),
    Int(i64),
    BigInt(String),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Box<DictNode>),
    Tensor(Box<Tensor>),
    Global(Global, Box<str>),
    Storage(Box<StorageNode>),
    /// `numpy._core.multiarray._reconstruct(ndarray, ...)`: an array waiting for BUILD.
    NdArrayStub,
    NumpyDtype {
        kind: u8,
        size: usize,
        big_endian: bool,
    },
    /// A list whose items so far are all ints, all floats or all bools, stored packed
    /// (see [`Unpickler::packed_appends`]); never empty.
    Packed(Arc<Packed>),
}

impl Node {
    /// The Python type name, for messages.
    fn kind(&self) -> &'static str {
        match self {
            Node::None => "None",
            Node::Bool(_) => "bool",
            Node::Int(_) | Node::BigInt(_) => "int",
            Node::Float(_) => "float",
            Node::Str(_) => "str",
            Node::Bytes(_) => "bytes",
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Dict(_) => "dict",
            Node::Tensor(_) => "tensor",
            Node::Global(..) => "global",
            Node::Storage(_) => "storage",
            Node::NdArrayStub => "numpy.ndarray",
            Node::NumpyDtype { .. } => "numpy.dtype",
            Node::Packed(_) => "list",
        }
    }
}

/// Read a pickle into a value. `member` names the zip member in errors; `load_storage`
/// answers persistent ids (`('storage', torch.FloatStorage, key, location, numel)`)
/// with the storage's bytes, or a message naming what is missing.
pub fn unpickle(
    data: &[u8],
    member: &str,
    load_storage: &mut dyn FnMut(&StorageRequest<'_>) -> Result<Bytes, String>,
) -> Result<Value, FormatError> {
    let mut u = Unpickler {
        data,
        pos: 0,
        op_at: 0,
        member,
        nodes: Vec::new(),
        depth: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        load_storage,
    };
    let root = u.run()?;
    u.materialize(root)
}

struct Unpickler<'a, 'f> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed, for errors.
    op_at: usize,
    member: &'a str,
    nodes: Vec<Node>,
    /// Nesting depth of each node as far as known (leaves 0).
    depth: Vec<u16>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
    load_storage: &'f mut dyn FnMut(&StorageRequest<'_>) -> Result<Bytes, String>,
}

impl Unpickler<'_, '_> {
    fn err(&self, msg: impl Into<String>) -> FormatError {
        FormatError::new(
            Position::PickleOp {
                member: self.member.to_string(),
                offset: self.op_at as u64,
            },
            msg,
        )
    }

    // ------------------------------------------------------------ input

    fn take(&mut self, n: usize) -> Result<&[u8], FormatError> {
        let data = self.data;
        let end = self.pos.checked_add(n).filter(|&e| e <= data.len());
        match end {
            Some(end) => {
                let s = &data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(format!(
                "pickle ends early: opcode needs {n} more bytes, {} left",
                data.len() - self.pos
            ))),
        }
    }

    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn len_u32(&mut self) -> Result<usize, FormatError> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }

    fn len_i32(&mut self) -> Result<usize, FormatError> {
        let n = i32::from_le_bytes(self.array()?);
        usize::try_from(n).map_err(|_| self.err(format!("negative length {n}")))
    }

    fn len_u64(&mut self) -> Result<usize, FormatError> {
        let n = u64::from_le_bytes(self.array()?);
        usize::try_from(n).map_err(|_| self.err(format!("length {n} exceeds the address space")))
    }

    /// A text argument up to (not including) the next newline.
    fn line(&mut self) -> Result<&[u8], FormatError> {
        let data = self.data;
        let rest = &data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(self.err("pickle ends early: text argument has no newline")),
        }
    }

    fn line_str(&mut self) -> Result<String, FormatError> {
        let l = self.line()?;
        match std::str::from_utf8(l) {
            Ok(s) => Ok(s.trim_end_matches('\r').to_string()),
            Err(_) => Err(self.err("text argument is not valid UTF-8")),
        }
    }

    // ------------------------------------------------------------ arena and stack

    fn add(&mut self, node: Node) -> Id {
        self.nodes.push(node);
        self.depth.push(0);
        self.nodes.len() - 1
    }

    fn push(&mut self, node: Node) {
        let id = self.add(node);
        self.stack.push(id);
    }

    fn pop(&mut self) -> Result<Id, FormatError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow: opcode needs an argument that is not there"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.err("stack underflow: opcode needs an argument"))
    }

    fn top(&self) -> Result<Id, FormatError> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.err("stack underflow: opcode needs an object on the stack"))
    }

    /// Everything pushed since the last MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Id>, FormatError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.err("opcode needs a MARK but none is open"))?;
        if m > self.stack.len() {
            return Err(self.err("MARK points past the top of the stack"));
        }
        Ok(self.stack.split_off(m))
    }

    /// Record that `child` now sits inside `parent`; refuse nesting beyond [`MAX_DEPTH`].
    fn nest(&mut self, parent: Id, child: Id) -> Result<(), FormatError> {
        let d = self.depth[child].saturating_add(1);
        if d as usize > MAX_DEPTH {
            return Err(self.err(format!("containers nested deeper than {MAX_DEPTH} levels")));
        }
        if d > self.depth[parent] {
            self.depth[parent] = d;
        }
        Ok(())
    }

    /// A new list or tuple node holding `items`.
    fn new_seq(&mut self, items: Vec<Id>, tuple: bool) -> Result<Id, FormatError> {
        let inner = items.iter().map(|&c| self.depth[c]).max().unwrap_or(0);
        let depth = inner.saturating_add(1);
        if depth as usize > MAX_DEPTH {
            return Err(self.err(format!("containers nested deeper than {MAX_DEPTH} levels")));
        }
        let id = self.add(if tuple {
            Node::Tuple(items)
        } else {
            Node::List(items)
        });
        self.depth[id] = depth;
        Ok(id)
    }

    fn new_list(&mut self, items: Vec<Id>) -> Result<Id, FormatError> {
        self.new_seq(items, false)
    }

    fn new_tuple(&mut self, items: Vec<Id>) -> Result<Id, FormatError> {
        self.new_seq(items, true)
    }

    fn new_dict(&mut self) -> Result<Id, FormatError> {
        let id = self.add(Node::Dict(Box::default()));
        self.depth[id] = 1;
        Ok(id)
    }

    fn key_repr(&self, id: Id) -> KeyRepr {
        match &self.nodes[id] {
            Node::None => KeyRepr::None,
            Node::Bool(b) => KeyRepr::Int(*b as i64),
            Node::Int(i) => KeyRepr::Int(*i),
            Node::BigInt(s) => KeyRepr::BigInt(s.clone()),
            Node::Float(f) => {
                if f.fract() == 0.0 && f.abs() < 9.2e18 {
                    KeyRepr::Int(*f as i64)
                } else if f.is_nan() {
                    KeyRepr::Object(id)
                } else {
                    KeyRepr::Float(f.to_bits())
                }
            }
            Node::Str(s) => KeyRepr::Str(s.clone()),
            Node::Bytes(b) => KeyRepr::Bytes(b.clone()),
            _ => KeyRepr::Object(id),
        }
    }

    fn set_item(&mut self, dict: Id, key: Id, value: Id) -> Result<(), FormatError> {
        let repr = self.key_repr(key);
        self.nest(dict, key)?;
        self.nest(dict, value)?;
        let kind = self.nodes[dict].kind();
        let Node::Dict(d) = &mut self.nodes[dict] else {
            return Err(self.err(format!("SETITEM on a {kind}, not a dict")));
        };
        match d.index.get(&repr) {
            Some(&i) => d.items[i].1 = value,
            None => {
                d.index.insert(repr, d.items.len());
                d.items.push((key, value));
            }
        }
        Ok(())
    }

    fn extend_list(&mut self, list: Id, items: Vec<Id>) -> Result<(), FormatError> {
        if matches!(self.nodes[list], Node::Packed(_)) {
            if self.push_packed(list, &items) {
                return Ok(());
            }
            self.unpack(list);
        }
        for &c in &items {
            self.nest(list, c)?;
        }
        let kind = self.nodes[list].kind();
        match &mut self.nodes[list] {
            Node::List(v) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(self.err(format!("APPEND/ADDITEMS on a {kind}, not a list or set"))),
        }
    }

    // ------------------------------------------------------------ packed lists

    /// Called at a MARK: when the list on top of the stack is empty or packed and the
    /// batch that follows (`MARK x1 … xn APPENDS`, how the pickler writes a list, 1000
    /// items a batch) holds only ints (BININT1/BININT2/BININT/LONG1), only floats
    /// (BINFLOAT) or only bools (NEWTRUE/NEWFALSE) of the list's own kind, append them
    /// packed, consume the batch and return true. Otherwise leave input and list as
    /// they were and return false: the batch is read the ordinary way.
    fn packed_appends(&mut self) -> bool {
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
    fn push_packed(&mut self, list: Id, items: &[Id]) -> bool {
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
    fn unpack(&mut self, id: Id) {
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
    fn unpack_args(&mut self, args: Id) {
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
    fn shrink_packed(&mut self) {
        for n in &mut self.nodes {
            if let Node::Packed(p) = n {
                if let Some(p) = Arc::get_mut(p) {
                    p.shrink_to_fit();
                }
            }
        }
    }

    // ------------------------------------------------------------ the loop

    fn run(&mut self) -> Result<Id, FormatError> {
        loop {
            self.op_at = self.pos;
            if self.pos >= self.data.len() {
                return Err(self.err("pickle ends without a STOP opcode (truncated?)"));
            }
            let op = self.u8()?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return Err(self.err(format!("unsupported pickle protocol {p}")));
                    }
                }
                0x95 => {
                    self.take(8)?;
                }
                b'.' => return self.pop(),
                b'(' => {
                    if !self.packed_appends() {
                        self.marks.push(self.stack.len());
                    }
                }
                b'0' => {
                    if self.stack.len() > self.marks.last().copied().unwrap_or(0) {
                        self.pop()?;
                    } else {
                        self.pop_mark()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let t = self.top()?;
                    self.stack.push(t);
                }
                b'N' => self.push(Node::None),
                0x88 => self.push(Node::Bool(true)),
                0x89 => self.push(Node::Bool(false)),
                b'I' => {
                    let s = self.line_str()?;
                    let node = match s.as_str() {
                        "00" => Node::Bool(false),
                        "01" => Node::Bool(true),
                        _ => self.parse_decimal(&s)?,
                    };
                    self.push(node);
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.array()?);
                    self.push(Node::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Node::Int(v as i64));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.array()?);
                    self.push(Node::Int(v as i64));
                }
                b'L' => {
                    let s = self.line_str()?;
                    let node = self.parse_decimal(s.trim_end_matches('L'))?;
                    self.push(node);
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.u8()? as usize
                    } else {
                        self.len_i32()?
                    };
                    if n > MAX_LONG_BYTES {
                        return Err(self.err(format!(
                            "integer of {n} bytes is longer than the {MAX_LONG_BYTES} accepted"
                        )));
                    }
                    let b = self.take(n)?;
                    let node = long_from_le(b);
                    self.push(node);
                }
                b'F' => {
                    let s = self.line_str()?;
                    let v: f64 = s
                        .trim()
                        .parse()
                        .map_err(|_| self.err(format!("FLOAT argument {s:?} is not a number")))?;
                    self.push(Node::Float(v));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.array()?);
                    self.push(Node::Float(v));
                }
                b'S' => {
                    let l = self.line()?.to_vec();
                    let bytes = unquote_repr(&l)
                        .ok_or_else(|| self.err("STRING argument is not a quoted string"))?;
                    let s = self.utf8(bytes)?;
                    self.push(Node::Str(s));
                }
                b'T' | b'U' | b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        b'T' => self.len_i32()?,
                        b'U' | 0x8c => self.u8()? as usize,
                        b'X' => self.len_u32()?,
                        _ => self.len_u64()?,
                    };
                    let b = self.take(n)?.to_vec();
                    let s = self.utf8(b)?;
                    self.push(Node::Str(s));
                }
                b'V' => {
                    let l = self.line()?.to_vec();
                    let s = raw_unicode_escape(&l)
                        .ok_or_else(|| self.err("UNICODE argument has a bad escape"))?;
                    self.push(Node::Str(s));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'B' => self.len_u32()?,
                        b'C' => self.u8()? as usize,
                        _ => self.len_u64()?,
                    };
                    let b = self.take(n)?.to_vec();
                    self.push(Node::Bytes(b));
                }
                b']' | 0x8f => {
                    let id = self.new_list(Vec::new())?;
                    self.stack.push(id);
                }
                b'a' => {
                    let v = self.pop()?;
                    let list = self.top()?;
                    self.extend_list(list, vec![v])?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    self.extend_list(list, items)?;
                }
                b'l' | 0x91 => {
                    let items = self.pop_mark()?;
                    let id = self.new_list(items)?;
                    self.stack.push(id);
                }
                b')' => {
                    let id = self.new_tuple(Vec::new())?;
                    self.stack.push(id);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let id = self.new_tuple(items)?;
                    self.stack.push(id);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.err(format!("TUPLE{n} needs {n} items on the stack")));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let id = self.new_tuple(items)?;
                    self.stack.push(id);
                }
                b'}' => {
                    let id = self.new_dict()?;
                    self.stack.push(id);
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let id = self.new_dict()?;
                    self.set_items(id, &items)?;
                    self.stack.push(id);
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let d = self.top()?;
                    self.set_item(d, k, v)?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let d = self.top()?;
                    self.set_items(d, &items)?;
                }
                b'g' | b'h' | b'j' => {
                    let idx = match op {
                        b'g' => self.line_index()?,
                        b'h' => self.u8()? as u64,
                        _ => u32::from_le_bytes(self.array()?) as u64,
                    };
                    let id = *self
                        .memo
                        .get(&idx)
                        .ok_or_else(|| self.err(format!("memo GET of index {idx} never PUT")))?;
                    self.stack.push(id);
                }
                b'p' | b'q' | b'r' | 0x94 => {
                    let idx = match op {
                        b'p' => self.line_index()?,
                        b'q' => self.u8()? as u64,
                        b'r' => u32::from_le_bytes(self.array()?) as u64,
                        _ => self.memo.len() as u64,
                    };
                    let top = self.top()?;
                    self.memo.insert(idx, top);
                }
                b'c' => {
                    let module = self.line_str()?;
                    let name = self.line_str()?;
                    self.push_global(&module, &name)?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (&self.nodes[module], &self.nodes[name]) {
                        (Node::Str(m), Node::Str(n)) => {
                            let (m, n) = (m.clone(), n.clone());
                            self.push_global(&m, &n)?;
                        }
                        _ => return Err(self.err("STACK_GLOBAL needs two strings")),
                    }
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let func = self.pop()?;
                    self.unpack_args(args);
                    let id = self.call(func, args)?;
                    self.stack.push(id);
                }
                b'b' => {
                    let state = self.pop()?;
                    let obj = self.top()?;
                    self.build(obj, state)?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let id = self.persistent_load(pid)?;
                    self.stack.push(id);
                }
                b'P' => {
                    // A text persistent id is a str, which no torch storage uses; it is
                    // decoded and then refused by `persistent_load` with its type.
                    let s = self.line_str()?;
                    let pid = self.add(Node::Str(s));
                    let id = self.persistent_load(pid)?;
                    self.stack.push(id);
                }
                _ => return Err(self.err(refused_opcode(op))),
            }
        }
    }

    fn set_items(&mut self, dict: Id, items: &[Id]) -> Result<(), FormatError> {
        if items.len() % 2 != 0 {
            return Err(self.err("SETITEMS/DICT with an odd number of items"));
        }
        for pair in items.chunks_exact(2) {
            self.set_item(dict, pair[0], pair[1])?;
        }
        Ok(())
    }

    fn line_index(&mut self) -> Result<u64, FormatError> {
        let s = self.line_str()?;
        s.trim()
            .parse()
            .map_err(|_| self.err(format!("memo index {s:?} is not a number")))
    }

    fn utf8(&self, b: Vec<u8>) -> Result<String, FormatError> {
        String::from_utf8(b).map_err(|e| {
            self.err(format!(
                "string is not valid UTF-8 (at byte {})",
                e.utf8_error().valid_up_to()
            ))
        })
    }

    fn parse_decimal(&self, s: &str) -> Result<Node, FormatError> {
        let t = s.trim();
        if let Ok(v) = t.parse::<i64>() {
            return Ok(Node::Int(v));
        }
        let (neg, digits) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        if digits.is_empty()
            || digits.len() > MAX_LONG_DIGITS
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(self.err(format!("integer argument {s:?} is not a decimal number")));
        }
        let digits = digits.trim_start_matches('0');
        // i64 parsing failed and the digits are valid, so the value is outside i64.
        Ok(Node::BigInt(if neg {
            format!("-{digits}")
        } else {
            digits.to_string()
        }))
    }

    fn push_global(&mut self, module: &str, name: &str) -> Result<(), FormatError> {
        match lookup_global(module, name) {
            Some(g) => {
                self.push(Node::Global(g, format!("{module}.{name}").into()));
                Ok(())
            }
            None => Err(self.err(format!(
                "refused global {module}.{name}: only torch tensor, storage and container \
                 globals are allowed (this reader never imports or runs code)"
            ))),
        }
    }

    // ------------------------------------------------------------ interpreted calls

    fn int_arg(&self, id: Id, what: &str) -> Result<usize, FormatError> {
        match self.nodes[id] {
            Node::Int(v) if v >= 0 => usize::try_from(v)
                .map_err(|_| self.err(format!("{what} {v} exceeds the address space"))),
            Node::Bool(b) => Ok(b as usize),
            ref n => Err(self.err(format!(
                "{what} must be a non-negative int, found {}",
                match n {
                    Node::Int(v) => v.to_string(),
                    other => other.kind().to_string(),
                }
            ))),
        }
    }

    fn seq(&self, id: Id) -> Option<&[Id]> {
        match &self.nodes[id] {
            Node::List(v) | Node::Tuple(v) => Some(v),
            _ => None,
        }
    }

    fn int_tuple(&self, id: Id, what: &str) -> Result<Vec<usize>, FormatError> {
        let items = self
            .seq(id)
            .ok_or_else(|| self.err(format!("{what} must be a tuple of ints")))?;
        items.iter().map(|&i| self.int_arg(i, what)).collect()
    }

    fn call(&mut self, func: Id, args: Id) -> Result<Id, FormatError> {
        let (g, gname) = match &self.nodes[func] {
            Node::Global(g, n) => (*g, n.clone()),
            other => {
                return Err(self.err(format!(
                    "REDUCE/NEWOBJ on a {}: only allowed globals may be called",
                    other.kind()
                )))
            }
        };
        let args: Vec<Id> = match &self.nodes[args] {
            Node::Tuple(v) => v.clone(),
            other => {
                return Err(self.err(format!(
                    "arguments of {gname} must be a tuple, found {}",
                    other.kind()
                )))
            }
        };
        let bad = |u: &Self, why: &str| u.err(format!("{gname}: {why}"));
        match g {
            Global::RebuildTensorV2 | Global::RebuildTensor => {
                if args.len() < 4 || args.len() > 7 {
                    return Err(bad(
                        self,
                        &format!("expected 4 to 7 arguments, got {}", args.len()),
                    ));
                }
                let (bytes, dtype, key) = match &self.nodes[args[0]] {
                    Node::Storage(st) => (st.bytes.clone(), st.dtype, st.key.clone()),
                    other => {
                        return Err(bad(
                            self,
                            &format!("first argument must be a storage, found {}", other.kind()),
                        ))
                    }
                };
                let offset = self.int_arg(args[1], "storage offset")?;
                let shape = self.int_tuple(args[2], "size")?;
                let strides = self.int_tuple(args[3], "stride")?;
                let t = Tensor::from_parts(dtype, shape, strides, offset, bytes, Some(key.clone()))
                    .map_err(|e| bad(self, &format!("tensor over storage {key}: {e}")))?;
                Ok(self.add(Node::Tensor(Box::new(t))))
            }
            Global::RebuildParameter | Global::RebuildParameterWithState => match args.first() {
                Some(&t) if matches!(self.nodes[t], Node::Tensor(_)) => Ok(t),
                _ => Err(bad(self, "first argument must be a tensor")),
            },
            Global::OrderedDict => {
                let d = self.new_dict()?;
                match args.as_slice() {
                    [] => {}
                    [pairs] => {
                        let pairs = self
                            .seq(*pairs)
                            .ok_or_else(|| bad(self, "argument must be a list of pairs"))?
                            .to_vec();
                        for p in pairs {
                            match self.seq(p) {
                                Some(&[k, v]) => self.set_item(d, k, v)?,
                                _ => return Err(bad(self, "argument must be a list of pairs")),
                            }
                        }
                    }
                    _ => return Err(bad(self, "expected at most one argument")),
                }
                Ok(d)
            }
            Global::Size => match args.as_slice() {
                [dims] => {
                    self.int_tuple(*dims, "torch.Size dimension")?;
                    let items = self.seq(*dims).map(<[Id]>::to_vec).unwrap_or_default();
                    self.new_tuple(items)
                }
                _ => Err(bad(self, "expected one tuple of ints")),
            },
            Global::CodecsEncode => match args.as_slice() {
                [s, enc] => {
                    let b = self.encode_str(*s, Some(*enc), &gname)?;
                    Ok(self.add(Node::Bytes(b)))
                }
                [s] => {
                    let b = self.encode_str(*s, None, &gname)?;
                    Ok(self.add(Node::Bytes(b)))
                }
                _ => Err(bad(self, "expected (str, encoding)")),
            },
            Global::Bytes | Global::ByteArray => {
                let b = match args.as_slice() {
                    [] => Vec::new(),
                    [x] => match &self.nodes[*x] {
                        Node::Bytes(b) => b.clone(),
                        Node::List(_) | Node::Tuple(_) => {
                            let ints = self.int_tuple(*x, "byte")?;
                            ints.iter()
                                .map(|&i| {
                                    u8::try_from(i).map_err(|_| bad(self, "byte out of range"))
                                })
                                .collect::<Result<Vec<u8>, _>>()?
                        }
                        other => {
                            return Err(bad(
                                self,
                                &format!("cannot make bytes from {}", other.kind()),
                            ))
                        }
                    },
                    [s, enc] => self.encode_str(*s, Some(*enc), &gname)?,
                    _ => return Err(bad(self, "too many arguments")),
                };
                Ok(self.add(Node::Bytes(b)))
            }
            Global::Set | Global::FrozenSet => match args.as_slice() {
                [] => self.new_list(Vec::new()),
                [items] => {
                    let items = self
                        .seq(*items)
                        .ok_or_else(|| bad(self, "argument must be a list"))?
                        .to_vec();
                    self.new_list(items)
                }
                _ => Err(bad(self, "expected at most one argument")),
            },
            Global::NumpyDtype => {
                let spec = match args.first().map(|&a| &self.nodes[a]) {
                    Some(Node::Str(s)) => s.clone(),
                    _ => return Err(bad(self, "first argument must be a dtype string")),
                };
                let (kind, size, big_endian) = parse_numpy_dtype(&spec)
                    .ok_or_else(|| bad(self, &format!("unsupported numpy dtype {spec:?}")))?;
                Ok(self.add(Node::NumpyDtype {
                    kind,
                    size,
                    big_endian,
                }))
            }
            Global::NumpyScalar => {
                let (dt, raw) = match args.as_slice() {
                    [dt, raw] => (*dt, *raw),
                    _ => return Err(bad(self, "expected (dtype, bytes)")),
                };
                let (kind, size, big) = match self.nodes[dt] {
                    Node::NumpyDtype {
                        kind,
                        size,
                        big_endian,
                    } => (kind, size, big_endian),
                    _ => return Err(bad(self, "first argument must be a numpy.dtype")),
                };
                let raw = match &self.nodes[raw] {
                    Node::Bytes(b) if b.len() == size => b.clone(),
                    _ => return Err(bad(self, &format!("second argument must be {size} bytes"))),
                };
                let node = numpy_scalar(kind, &raw, big)
                    .ok_or_else(|| bad(self, "unsupported numpy scalar"))?;
                Ok(self.add(node))
            }
            Global::NumpyReconstruct => match args.first().map(|&a| &self.nodes[a]) {
                Some(Node::Global(Global::NumpyNdarray, _)) => Ok(self.add(Node::NdArrayStub)),
                _ => Err(bad(self, "only numpy.ndarray can be reconstructed")),
            },
            Global::Storage(_) | Global::NumpyNdarray => {
                Err(bad(self, "this class cannot be called"))
            }
        }
    }

    fn encode_str(&self, s: Id, enc: Option<Id>, gname: &str) -> Result<Vec<u8>, FormatError> {
        let Node::Str(s) = &self.nodes[s] else {
            return Err(self.err(format!("{gname}: first argument must be a str")));
        };
        let enc = match enc.map(|e| &self.nodes[e]) {
            None => "utf-8".to_string(),
            Some(Node::Str(e)) => e.to_ascii_lowercase().replace('_', "-"),
            Some(_) => return Err(self.err(format!("{gname}: encoding must be a str"))),
        };
        match enc.as_str() {
            "latin1" | "latin-1" | "iso-8859-1" | "iso8859-1" | "l1" => s
                .chars()
                .map(|c| u8::try_from(c as u32).ok())
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| self.err(format!("{gname}: str is not latin-1"))),
            "utf-8" | "utf8" => Ok(s.as_bytes().to_vec()),
            "ascii" if s.is_ascii() => Ok(s.as_bytes().to_vec()),
            other => Err(self.err(format!("{gname}: unsupported encoding {other:?}"))),
        }
    }

    fn build(&mut self, obj: Id, state: Id) -> Result<(), FormatError> {
        let empty = match &self.nodes[state] {
            Node::None => true,
            Node::Dict(d) => d.items.is_empty(),
            Node::Tuple(v) => v.iter().all(|&i| match &self.nodes[i] {
                Node::None => true,
                Node::Dict(d) => d.items.is_empty(),
                _ => false,
            }),
            _ => false,
        };
        if empty {
            return Ok(());
        }
        if matches!(self.nodes[obj], Node::NdArrayStub) {
            let t = self.ndarray_from_state(state)?;
            self.nodes[obj] = Node::Tensor(Box::new(t));
            return Ok(());
        }
        let byteorder = match (&self.nodes[obj], self.seq(state)) {
            (Node::NumpyDtype { .. }, Some(s)) if s.len() >= 2 => match &self.nodes[s[1]] {
                Node::Str(b) => Some(b.clone()),
                _ => None,
            },
            _ => None,
        };
        match (byteorder, &mut self.nodes[obj]) {
            (Some(b), Node::NumpyDtype { big_endian, .. }) => {
                *big_endian = b == ">";
                Ok(())
            }
            (_, other) => {
                let kind = other.kind();
                Err(self.err(format!(
                    "BUILD with a non-empty state on a {kind} is not data-only"
                )))
            }
        }
    }

    /// A numpy array from its pickled state `(version, shape, dtype, fortran, data)`,
    /// copied (its bytes live in the pickle, not in a storage member).
    fn ndarray_from_state(&self, state: Id) -> Result<Tensor, FormatError> {
        let bad = |why: &str| self.err(format!("numpy.ndarray state: {why}"));
        let items = self.seq(state).ok_or_else(|| bad("not a tuple"))?;
        let [_, shape, dt, fortran, data] = items else {
            return Err(bad("expected (version, shape, dtype, fortran, data)"));
        };
        let shape = self.int_tuple(*shape, "numpy shape")?;
        let (kind, size, big) = match self.nodes[*dt] {
            Node::NumpyDtype {
                kind,
                size,
                big_endian,
            } => (kind, size, big_endian),
            _ => return Err(bad("dtype is not a numpy.dtype")),
        };
        let dtype = match (kind, size) {
            (b'f', 2) => DType::F16,
            (b'f', 4) => DType::F32,
            (b'f', 8) => DType::F64,
            (b'i', 1) => DType::I8,
            (b'i', 2) => DType::I16,
            (b'i', 4) => DType::I32,
            (b'i', 8) => DType::I64,
            (b'u', 1) => DType::U8,
            (b'b', 1) => DType::Bool,
            _ => {
                return Err(bad(&format!(
                    "dtype {}{size} has no tensor dtype",
                    kind as char
                )))
            }
        };
        let fortran = matches!(self.nodes[*fortran], Node::Bool(true) | Node::Int(1));
        let Node::Bytes(raw) = &self.nodes[*data] else {
            return Err(bad("data is not bytes (object arrays are not data-only)"));
        };
        let raw = if big {
            Tensor::byteswapped_storage(raw, dtype)
        } else {
            raw.clone()
        };
        let strides = if fortran {
            let rev: Vec<usize> = shape.iter().rev().copied().collect();
            let mut s = crate::tensor::contiguous_strides(&rev);
            s.reverse();
            s
        } else {
            crate::tensor::contiguous_strides(&shape)
        };
        Tensor::from_parts(dtype, shape, strides, 0, Bytes::from_vec(raw), None)
            .map_err(|e| bad(&e.to_string()))
    }

    fn persistent_load(&mut self, pid: Id) -> Result<Id, FormatError> {
        let items = match &self.nodes[pid] {
            Node::Tuple(v) => v.clone(),
            other => {
                return Err(self.err(format!(
                    "persistent id must be a tuple, found {}",
                    other.kind()
                )))
            }
        };
        let [tag, ty, key, _location, numel] = items.as_slice() else {
            return Err(self.err(format!(
                "persistent id must be ('storage', type, key, location, numel), found {} items",
                items.len()
            )));
        };
        if !matches!(&self.nodes[*tag], Node::Str(s) if s == "storage") {
            return Err(self.err("persistent id does not start with 'storage'"));
        }
        let dtype = match &self.nodes[*ty] {
            Node::Global(Global::Storage(d), _) => *d,
            Node::Global(_, name) => return Err(self.err(format!("{name} is not a storage type"))),
            other => {
                return Err(self.err(format!(
                    "storage type must be a torch.<X>Storage global, found {}",
                    other.kind()
                )))
            }
        };
        let key = match &self.nodes[*key] {
            Node::Str(s) => s.clone(),
            Node::Int(i) => i.to_string(),
            other => {
                return Err(self.err(format!("storage key must be a str, found {}", other.kind())))
            }
        };
        let numel = self.int_arg(*numel, "storage numel")? as u64;
        let req = StorageRequest {
            key: &key,
            dtype,
            numel,
        };
        let bytes = (self.load_storage)(&req).map_err(|m| self.err(m))?;
        Ok(self.add(Node::Storage(Box::new(StorageNode { bytes, dtype, key }))))
    }

    // ------------------------------------------------------------ arena → Value

    /// Turn the arena graph under `root` into a tree, iteratively, refusing nesting past
    /// [`MAX_DEPTH`] and more materialised memory than a multiple of the pickle's size
    /// (shared memo references are copied, so a small pickle could otherwise explode).
    fn materialize(&mut self, root: Id) -> Result<Value, FormatError> {
        struct Frame {
            id: Id,
            next: usize,
            out: Vec<Value>,
        }
        self.shrink_packed();
        let len = self.data.len() as u64;
        let mut budget = Budget {
            items: len.saturating_mul(ITEMS_PER_BYTE).saturating_add(1 << 20),
            bytes: len.saturating_mul(BYTES_PER_BYTE).saturating_add(64 << 20),
        };
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
                    self.charge(&mut budget, 0)?;
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
                None => Some(self.leaf(current, &mut budget)?),
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
struct Budget {
    items: u64,
    bytes: u64,
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

fn refused_opcode(op: u8) -> String {
    let name = match op {
        b'i' => "INST",
        b'o' => "OBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x92 => "NEWOBJ_EX",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return format!("unknown pickle opcode 0x{op:02x} (not a pickle, or corrupt)"),
    };
    format!("refused pickle opcode {name}: not used by torch.save for data")
}

/// A little-endian two's complement integer of any length.
fn long_from_le(b: &[u8]) -> Node {
    if b.is_empty() {
        return Node::Int(0);
    }
    let neg = b[b.len() - 1] & 0x80 != 0;
    let fill = if neg { 0xff } else { 0 };
    if b.len() <= 8 || b[8..].iter().all(|&x| x == fill) && (b[7] & 0x80 != 0) == neg {
        let mut a = [fill; 8];
        let n = b.len().min(8);
        a[..n].copy_from_slice(&b[..n]);
        return Node::Int(i64::from_le_bytes(a));
    }
    // Magnitude, little-endian: negate two's complement when negative.
    let mut mag: Vec<u8> = b.to_vec();
    if neg {
        let mut carry = true;
        for x in mag.iter_mut() {
            let (v, c) = (!*x).overflowing_add(carry as u8);
            *x = v;
            carry = c;
        }
    }
    // Base 2^32 limbs, most significant first, divided repeatedly by 10^9.
    let mut limbs: Vec<u32> = mag
        .chunks(4)
        .rev()
        .map(|c| {
            let mut a = [0u8; 4];
            a[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(a)
        })
        .collect();
    let mut chunks: Vec<u32> = Vec::new();
    while limbs.iter().any(|&l| l != 0) {
        let mut rem: u64 = 0;
        for l in limbs.iter_mut() {
            let cur = (rem << 32) | *l as u64;
            *l = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        chunks.push(rem as u32);
        let lead = limbs.iter().position(|&l| l != 0).unwrap_or(limbs.len());
        limbs.drain(..lead);
    }
    let mut s = String::with_capacity(chunks.len() * 9 + 1);
    if neg {
        s.push('-');
    }
    for (i, c) in chunks.iter().rev().enumerate() {
        if i == 0 {
            s.push_str(&c.to_string());
        } else {
            s.push_str(&format!("{c:09}"));
        }
    }
    Node::BigInt(s)
}

/// Decode a Python `repr` of a byte string (protocol 0 STRING): quotes and escapes.
fn unquote_repr(l: &[u8]) -> Option<Vec<u8>> {
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    if l.len() < 2 || l[0] != l[l.len() - 1] || !matches!(l[0], b'\'' | b'"') {
        return None;
    }
    let body = &l[1..l.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'\\' | b'\'' | b'"' => out.push(e),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\n' => {}
            b'x' => {
                let h = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                for _ in 0..2 {
                    match body.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + (d - b'0') as u32;
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// Decode Python's `raw-unicode-escape` (protocol 0 UNICODE): latin-1 bytes plus
/// `\uXXXX` and `\UXXXXXXXX` escapes.
fn raw_unicode_escape(l: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(l.len());
    let mut i = 0;
    while i < l.len() {
        let c = l[i];
        if c == b'\\' && matches!(l.get(i + 1), Some(b'u' | b'U')) {
            let n = if l[i + 1] == b'u' { 4 } else { 8 };
            let h = std::str::from_utf8(l.get(i + 2..i + 2 + n)?).ok()?;
            out.push(char::from_u32(u32::from_str_radix(h, 16).ok()?)?);
            i += 2 + n;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    Some(out)
}

/// `(kind, size, big_endian)` of a numpy dtype string such as `f8`, `<i4`, `b1`.
fn parse_numpy_dtype(spec: &str) -> Option<(u8, usize, bool)> {
    let (big, rest) = match spec.as_bytes().first()? {
        b'>' => (true, &spec[1..]),
        b'<' | b'=' | b'|' => (false, &spec[1..]),
        _ => (false, spec),
    };
    let kind = *rest.as_bytes().first()?;
    let size: usize = rest[1..].parse().ok()?;
    let ok = match kind {
        b'f' => matches!(size, 2 | 4 | 8),
        b'i' | b'u' => matches!(size, 1 | 2 | 4 | 8),
        b'b' => size == 1,
        _ => false,
    };
    ok.then_some((kind, size, big))
}

/// The Python number a numpy scalar of `kind` holds in `raw` (its exact size).
fn numpy_scalar(kind: u8, raw: &[u8], big: bool) -> Option<Node> {
    let mut b = raw.to_vec();
    if big {
        b.reverse();
    }
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    Some(match (kind, b.len()) {
        (b'b', 1) => Node::Bool(b[0] != 0),
        (b'f', 2) => Node::Float(f16::from_le_bytes([b[0], b[1]]).to_f64()),
        (b'f', 4) => Node::Float(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
        (b'f', 8) => Node::Float(f64::from_le_bytes(a)),
        (b'i', n @ (1 | 2 | 4 | 8)) => {
            if b[n - 1] & 0x80 != 0 {
                a[n..].fill(0xff);
            }
            Node::Int(i64::from_le_bytes(a))
        }
        (b'u', 1 | 2 | 4 | 8) => {
            let v = u64::from_le_bytes(a);
            match i64::try_from(v) {
                Ok(i) => Node::Int(i),
                Err(_) => Node::BigInt(v.to_string()),
            }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_storage(_: &StorageRequest<'_>) -> Result<Bytes, String> {
        Err("no storages here".into())
    }

    fn run(p: &[u8]) -> Result<Value, FormatError> {
        unpickle(p, "t/data.pkl", &mut no_storage)
    }

    #[test]
    fn long1_negative_and_huge_ints_match_python() {
        // pickle.dumps(-2**70, 2), pickle.dumps(2**64, 2), pickle.dumps(-2**63 - 1, 2)
        let v = run(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0.").unwrap();
        assert!(matches!(v, Value::BigInt(ref s) if s == "-1180591620717411303424"));
        let v = run(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap();
        assert!(matches!(v, Value::BigInt(ref s) if s == "18446744073709551616"));
        let v = run(b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff.").unwrap();
        assert!(matches!(v, Value::BigInt(ref s) if s == "-9223372036854775809"));
        // pickle.dumps(-2**63, 2): fits i64.
        let v = run(b"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.").unwrap();
        assert!(matches!(v, Value::Int(i64::MIN)));
    }

    #[test]
    fn protocol0_text_opcodes() {
        // pickle.dumps([1, 2**70, 'h\xe9', 1.5, (True,)], 0)
        let p = b"(lp0\nI1\naL1180591620717411303424L\naVh\xe9\np1\naF1.5\na(I01\ntp2\na.";
        let v = run(p).unwrap();
        let items = v.as_seq().unwrap();
        assert!(matches!(items[0], Value::Int(1)));
        assert!(matches!(&items[1], Value::BigInt(s) if s == "1180591620717411303424"));
        assert!(matches!(&items[2], Value::Str(s) if s == "h\u{e9}"));
        assert!(matches!(items[3], Value::Float(f) if f == 1.5));
        assert!(matches!(&items[4], Value::Tuple(t) if matches!(t[0], Value::Bool(true))));
    }

    #[test]
    fn memo_shares_mutations_like_python() {
        // d = {}; pickle.dumps([d, d], 2) with d filled after being memoised:
        // ] q0 ( } q1 h1 e h1 U a K1 s .  → [ {'a':1}, {'a':1} ] sharing one dict.
        let p = b"\x80\x02]q\x00(}q\x01h\x01eh\x01U\x01aK\x01s0.";
        let v = run(p).unwrap();
        let items = v.as_seq().unwrap();
        assert_eq!(items.len(), 2);
        for d in items {
            assert!(matches!(d.get("a"), Some(Value::Int(1))));
        }
    }

    #[test]
    fn repeated_dict_key_replaces_in_place() {
        // { 'a': 1, 'b': 2, 'a': 3 } written by hand with SETITEMS
        let p = b"\x80\x02}(U\x01aK\x01U\x01bK\x02U\x01aK\x03u.";
        let v = run(p).unwrap();
        let d = v.as_dict().unwrap();
        assert_eq!(d.len(), 2);
        assert!(matches!(d[0], (Value::Str(ref k), Value::Int(3)) if k == "a"));
    }

    #[test]
    fn cyclic_list_is_refused_not_looped() {
        // l = []; l.append(l): ] q0 h0 a .
        let e = run(b"\x80\x02]q\x00h\x00a.").unwrap_err();
        assert!(e.msg.contains("deeper than 512"), "{e}");
    }

    #[test]
    fn refused_opcodes_name_themselves() {
        let e = run(b"\x80\x02(cos\nsystem\no.").unwrap_err();
        assert!(e.msg.contains("os.system"), "{e}");
        let e = run(b"Pfoo\n.").unwrap_err();
        assert!(
            e.msg.contains("persistent id must be a tuple, found str"),
            "{e}"
        );
        let e = run(b"\x80\x02\x82\x01.").unwrap_err();
        assert!(e.msg.contains("EXT1"), "{e}");
        assert_eq!(
            e.pos,
            Position::PickleOp {
                member: "t/data.pkl".into(),
                offset: 2
            }
        );
    }

    #[test]
    fn truncated_pickles_fail_cleanly() {
        let p = b"\x80\x02}q\x00(X\x05\x00\x00\x00abcdeK\x01u.";
        for n in 0..p.len() {
            assert!(run(&p[..n]).is_err(), "prefix {n}");
        }
        assert!(run(p).is_ok());
    }

    #[test]
    fn sets_bytes_and_text_forms_from_python_pickle() {
        // Each pickle is pickle.dumps(obj, proto) from CPython 3.
        let cases: &[(&[u8], &str)] = &[
            (b"\x80\x04\x95\t\x00\x00\x00\x00\x00\x00\x00\x8f\x94(K\x01K\x02\x90.", "List([Int(1), Int(2)])"),
            (b"\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00(K\x03\x91\x94.", "List([Int(3)])"),
            (b"\x80\x05\x95\r\x00\x00\x00\x00\x00\x00\x00\x96\x02\x00\x00\x00\x00\x00\x00\x00ab\x94.", "Bytes([97, 98])"),
            (b"\x80\x03C\x02abq\x00.", "Bytes([97, 98])"),
            (b"\x80\x02c__builtin__\nset\nq\x00]q\x01(K\x01K\x02e\x85q\x02Rq\x03.", "List([Int(1), Int(2)])"),
            (b"\x80\x02c__builtin__\nbytearray\nq\x00c_codecs\nencode\nq\x01X\x02\x00\x00\x00abq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05\x85q\x06Rq\x07.", "Bytes([97, 98])"),
            (b"\x80\x02c__builtin__\nbytes\nq\x00)Rq\x01.", "Bytes([])"),
            (b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.", "Dict([])"),
            (b"F1.5\n.", "Float(1.5)"),
            (b"Va\\u000ab\\u20ac\np0\n.", "Str(\"a\\nb\u{20ac}\")"),
            (b"L-1180591620717411303424L\n.", "BigInt(\"-1180591620717411303424\")"),
            (b"c_codecs\nencode\np0\n(Vx'\\u000a\np1\nVlatin1\np2\ntp3\nRp4\n.", "Bytes([120, 39, 10])"),
            // Hand-made: BUILD with an empty state on an OrderedDict is a no-op.
            (b"\x80\x02ccollections\nOrderedDict\n)R}b.", "Dict([])"),
        ];
        for (p, want) in cases {
            let v = run(p).unwrap_or_else(|e| panic!("{want}: {e}"));
            assert_eq!(format!("{v:?}"), *want);
        }
    }

    #[test]
    fn memo_bomb_is_refused_by_the_budget() {
        // x = 1; then 200 times x = (x, x): 2**200 leaves if copied out.
        let mut p = b"\x80\x02K\x01".to_vec();
        for _ in 0..200 {
            p.extend_from_slice(b"2\x86");
        }
        p.push(b'.');
        let e = run(&p).unwrap_err();
        assert!(e.msg.contains("expands to too many objects"), "{e}");
    }
}
