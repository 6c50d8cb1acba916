//! Globals interpreted by REDUCE and BUILD, and persistent ids: tensors, storages,
//! containers, bytes helpers and numpy values built in the arena.

use super::decode::{numpy_scalar, parse_numpy_dtype};
use super::*;

impl Unpickler<'_, '_, '_> {
    // ------------------------------------------------------------ interpreted calls

    pub(super) fn int_arg(&self, id: Id, what: &str) -> Result<usize, FormatError> {
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

    pub(super) fn seq(&self, id: Id) -> Option<&[Id]> {
        match &self.nodes[id] {
            Node::List(v) | Node::Tuple(v) => Some(v),
            _ => None,
        }
    }

    pub(super) fn int_tuple(&self, id: Id, what: &str) -> Result<Vec<usize>, FormatError> {
        let items = self
            .seq(id)
            .ok_or_else(|| self.err(format!("{what} must be a tuple of ints")))?;
        items.iter().map(|&i| self.int_arg(i, what)).collect()
    }

    pub(super) fn call(&mut self, func: Id, args: Id) -> Result<Id, FormatError> {
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
                if let Node::Dict(n) = &mut self.nodes[d] {
                    n.ordered = true;
                }
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
            Global::DataClass => self.data_object(&gname, &args),
            Global::Getattr => {
                let nested = match args.as_slice() {
                    [c, a] => match (&self.nodes[*c], &self.nodes[*a]) {
                        (Node::Global(Global::DataClass, parent), Node::Str(attr)) => {
                            Some(format!("{parent}.{attr}"))
                        }
                        _ => None,
                    },
                    _ => None,
                };
                match nested {
                    Some(full) if super::globals::is_data_class(&full) => {
                        Ok(self.add(Node::Global(Global::DataClass, full.into())))
                    }
                    _ => Err(bad(
                        self,
                        "only a named data class's nested class may be looked up \
                         (this reader never imports or runs code)",
                    )),
                }
            }
            _ => self.call_more(g, &gname, &args),
        }
    }

    pub(super) fn encode_str(
        &self,
        s: Id,
        enc: Option<Id>,
        gname: &str,
    ) -> Result<Vec<u8>, FormatError> {
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

    /// Why global `module.name` is refused; named with the `builtins.getattr` it would be
    /// looked up by, when it is that call's first argument (`getattr(torch.load, …)`).
    pub(super) fn refusal(&self, module: &str, name: &str) -> String {
        let mut m = format!(
            "refused global {module}.{name}: only torch tensor, storage and container \
             globals are allowed (this reader never imports or runs code)"
        );
        if let Some(Node::Global(Global::Getattr, g)) = self.stack.last().map(|&i| &self.nodes[i]) {
            m.push_str(&format!(
                "; {g} looks up only a named data class's nested class"
            ));
        }
        m
    }

    /// A call of a [`Global::DataClass`]: the dict `{"__class__": name}`, with
    /// `"__args__": args` when called with arguments (an enum member, a rebuild function).
    fn data_object(&mut self, gname: &str, args: &[Id]) -> Result<Id, FormatError> {
        let d = self.new_dict()?;
        let k = self.add(Node::Str("__class__".into()));
        let v = self.add(Node::Str(gname.into()));
        self.set_item(d, k, v)?;
        if !args.is_empty() {
            let k = self.add(Node::Str("__args__".into()));
            let v = self.new_tuple(args.to_vec())?;
            self.set_item(d, k, v)?;
        }
        Ok(d)
    }

    /// Whether `id` is a [`Self::data_object`] (a dict whose first key is `__class__`).
    fn is_data_object(&self, id: Id) -> bool {
        match &self.nodes[id] {
            Node::Dict(d) => d
                .items
                .first()
                .is_some_and(|&(k, _)| matches!(&self.nodes[k], Node::Str(s) if s == "__class__")),
            _ => false,
        }
    }

    /// BUILD on a data object: a dict state (a dataclass's `__dict__`), or the
    /// `(dict, slots)` pair of a class with slots, is merged into it; any other state (a
    /// `__getstate__` tuple) is kept under `"__state__"`.
    fn build_data_object(&mut self, obj: Id, state: Id) -> Result<(), FormatError> {
        let parts: Vec<Id> = match &self.nodes[state] {
            Node::Dict(_) => vec![state],
            Node::Tuple(v)
                if v.len() == 2
                    && v.iter()
                        .all(|&i| matches!(self.nodes[i], Node::Dict(_) | Node::None)) =>
            {
                v.clone()
            }
            _ => {
                let k = self.add(Node::Str("__state__".into()));
                return self.set_item(obj, k, state);
            }
        };
        for p in parts {
            if let Node::Dict(d) = &self.nodes[p] {
                let items = d.items.clone();
                for (k, v) in items {
                    self.set_item(obj, k, v)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn build(&mut self, obj: Id, state: Id) -> Result<(), FormatError> {
        if self.is_data_object(obj) {
            return self.build_data_object(obj, state);
        }
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
        // torch's safe loader sets an OrderedDict's attributes (`state_dict()._metadata`):
        // they are not items, so a dict of them is accepted and left out.
        if let (Node::Dict(d), Node::Dict(_)) = (&self.nodes[obj], &self.nodes[state]) {
            if d.ordered {
                return Ok(());
            }
        }
        if matches!(self.nodes[obj], Node::NdArrayStub) {
            if let Some(items) = self.object_array(state) {
                self.nodes[obj] = items;
                self.nest(obj, state)?;
                return Ok(());
            }
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

    /// A one-dimensional numpy object array (`|O8`, verl's `uid`) as the list of its
    /// items, which its state holds as a Python list; `None` for any other array.
    fn object_array(&self, state: Id) -> Option<Node> {
        let [_, shape, dt, _, data] = self.seq(state)? else {
            return None;
        };
        if !matches!(self.nodes[*dt], Node::NumpyDtype { kind: b'O', .. }) {
            return None;
        }
        if self.seq(*shape)?.len() != 1 {
            return None;
        }
        match &self.nodes[*data] {
            Node::List(v) => Some(Node::List(v.clone())),
            Node::Packed(p) => Some(Node::Packed(p.clone())),
            _ => None,
        }
    }

    /// A numpy array from its pickled state `(version, shape, dtype, fortran, data)`,
    /// copied (its bytes live in the pickle, not in a storage member).
    pub(super) fn ndarray_from_state(&self, state: Id) -> Result<Tensor, FormatError> {
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

    pub(super) fn persistent_load(&mut self, pid: Id) -> Result<Id, FormatError> {
        let items = match &self.nodes[pid] {
            Node::Tuple(v) => v.clone(),
            other => {
                return Err(self.err(format!(
                    "persistent id must be a tuple, found {}",
                    other.kind()
                )))
            }
        };
        // The legacy format adds a sixth item: None or (view_key, offset, numel).
        let (tag, ty, key, numel, view) = match *items.as_slice() {
            [tag, ty, key, _location, numel] => (tag, ty, key, numel, None),
            [tag, ty, key, _location, numel, view] => (tag, ty, key, numel, Some(view)),
            _ => {
                return Err(self.err(format!(
                    "persistent id must be ('storage', type, key, location, numel), found {} \
                     items",
                    items.len()
                )))
            }
        };
        let (tag, ty, key, numel) = (&tag, &ty, &key, &numel);
        let is_storage = match &self.nodes[*tag] {
            Node::Str(s) => s == "storage",
            Node::Bytes(b) => b == b"storage",
            _ => false,
        };
        if !is_storage {
            return Err(self.err("persistent id does not start with 'storage'"));
        }
        let dtype = match &self.nodes[*ty] {
            Node::Global(Global::Storage(d), _) => *d,
            Node::Global(Global::UntypedStorage, _) => DType::U8,
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
            Node::Bytes(b) if b.is_ascii() => String::from_utf8_lossy(b).into_owned(),
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
        let mut bytes = (self.load_storage)(&req).map_err(|m| self.err(m))?;
        let mut key = key;
        if let Some(view) = view.filter(|&v| !matches!(self.nodes[v], Node::None)) {
            let (vkey, offset, len) = match self.seq(view) {
                Some(&[k, o, n]) => (
                    k,
                    self.int_arg(o, "storage view offset")?,
                    self.int_arg(n, "storage view size")?,
                ),
                _ => return Err(self.err("storage view must be (key, offset, size)")),
            };
            let es = dtype.size();
            bytes = offset
                .checked_mul(es)
                .zip(len.checked_mul(es))
                .and_then(|(o, n)| bytes.slice(o, n))
                .ok_or_else(|| {
                    self.err(format!(
                        "storage view of {len} elements at {offset} reaches past storage {key}"
                    ))
                })?;
            key = match &self.nodes[vkey] {
                Node::Str(s) => s.clone(),
                Node::Int(i) => i.to_string(),
                _ => format!("{key}[{offset}..]"),
            };
        }
        Ok(self.add(Node::Storage(Box::new(StorageNode { bytes, dtype, key }))))
    }
}
