//! The tensor rebuilders and torch objects of torch's safe loader beyond plain tensors:
//! `_rebuild_tensor_v3` (dtypes with no typed storage), quantized, sparse and meta
//! tensors, tensors with Python attributes, `torch.dtype`/`torch.device` objects,
//! `complex` and `collections.Counter`.

use super::*;
use crate::tensor::Quantization;

impl Unpickler<'_, '_, '_> {
    /// Interpret a call of one of the globals this file handles.
    pub(super) fn call_more(
        &mut self,
        g: Global,
        gname: &str,
        args: &[Id],
    ) -> Result<Id, FormatError> {
        let bad = |u: &Self, why: &str| u.err(format!("{gname}: {why}"));
        match g {
            Global::RebuildTensorV3 => {
                // (storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
                if !(7..=8).contains(&args.len()) {
                    return Err(bad(
                        self,
                        &format!("expected 7 or 8 arguments, got {}", args.len()),
                    ));
                }
                let dtype = match &self.nodes[args[6]] {
                    Node::Global(Global::Dtype(Some(d)), _) => *d,
                    Node::Global(Global::Dtype(None), n) => {
                        return Err(bad(self, &format!("{n} tensors have no storage format")))
                    }
                    other => {
                        return Err(bad(
                            self,
                            &format!(
                                "seventh argument must be a torch.dtype, found {}",
                                other.kind()
                            ),
                        ))
                    }
                };
                let t = self.strided(args, dtype, gname)?;
                Ok(self.add(Node::Tensor(Box::new(t))))
            }
            Global::RebuildQTensor => {
                // (storage, offset, size, stride, quantizer_params, requires_grad, hooks)
                if !(5..=7).contains(&args.len()) {
                    return Err(bad(
                        self,
                        &format!("expected 5 to 7 arguments, got {}", args.len()),
                    ));
                }
                let dtype = self.storage_of(args[0], gname)?.1;
                if !dtype.is_quantized() {
                    return Err(bad(self, &format!("storage of {dtype} is not quantized")));
                }
                let t = self.strided(args, dtype, gname)?;
                let q = self.quantizer(args[4], gname)?;
                Ok(self.add(Node::Tensor(Box::new(t.with_quantization(q)))))
            }
            Global::RebuildSparseTensor => {
                let [layout, data] = args else {
                    return Err(bad(self, "expected (layout, data)"));
                };
                let Node::Str(layout) = &self.nodes[*layout] else {
                    return Err(bad(self, "first argument must be a layout"));
                };
                let layout = layout.clone();
                let parts = self
                    .seq(*data)
                    .ok_or_else(|| bad(self, "second argument must be a tuple"))?
                    .to_vec();
                let names: &[&str] = match (layout.as_str(), parts.len()) {
                    ("torch.sparse_coo", 3) => &["indices", "values", "size"],
                    ("torch.sparse_coo", 4) => &["indices", "values", "size", "is_coalesced"],
                    ("torch.sparse_csr" | "torch.sparse_bsr", 4) => {
                        &["crow_indices", "col_indices", "values", "size"]
                    }
                    ("torch.sparse_csc" | "torch.sparse_bsc", 4) => {
                        &["ccol_indices", "row_indices", "values", "size"]
                    }
                    (l, n) => {
                        return Err(bad(
                            self,
                            &format!("layout {l} with {n} parts is not known"),
                        ))
                    }
                };
                for (&p, name) in parts.iter().zip(names) {
                    let ok = match *name {
                        "size" => self.int_tuple(p, "sparse size").is_ok(),
                        "is_coalesced" => matches!(self.nodes[p], Node::Bool(_) | Node::None),
                        _ => matches!(self.nodes[p], Node::Tensor(_)),
                    };
                    if !ok {
                        return Err(bad(self, &format!("{name} has the wrong type")));
                    }
                }
                let d = self.new_dict()?;
                let k = self.add(Node::Str("layout".into()));
                let v = self.add(Node::Str(layout));
                self.set_item(d, k, v)?;
                for (&p, name) in parts.iter().zip(names) {
                    let k = self.add(Node::Str((*name).into()));
                    self.set_item(d, k, p)?;
                }
                Ok(d)
            }
            Global::RebuildMetaTensor | Global::RebuildWrapperSubclass => {
                // (dtype, size, stride, requires_grad), or (cls, dtype, size, stride,
                // offset, layout, device, requires_grad): a tensor with no data at all.
                let (dtype, size, stride, device) = match (g, args) {
                    (Global::RebuildMetaTensor, [dtype, size, stride, ..]) => {
                        (dtype, size, stride, None)
                    }
                    (_, [cls, dtype, size, stride, _, _, device, ..])
                        if matches!(
                            self.nodes[*cls],
                            Node::Global(Global::TensorClass | Global::ParameterClass, _)
                        ) && matches!(self.nodes[*device], Node::Str(_)) =>
                    {
                        (dtype, size, stride, Some(*device))
                    }
                    _ => {
                        return Err(bad(
                            self,
                            "expected (dtype, size, stride, …) of a torch.Tensor",
                        ))
                    }
                };
                if !matches!(self.nodes[*dtype], Node::Global(Global::Dtype(_), _)) {
                    return Err(bad(self, "first argument must be a torch.dtype"));
                }
                let shape = self.int_tuple(*size, "size")?;
                let strides = self.int_tuple(*stride, "stride")?;
                if shape.len() != strides.len() {
                    return Err(bad(self, "size and stride have different ranks"));
                }
                let d = self.new_dict()?;
                let items = [
                    ("device", device),
                    ("dtype", Some(*dtype)),
                    ("size", Some(*size)),
                    ("stride", Some(*stride)),
                ];
                for (name, v) in items {
                    let k = self.add(Node::Str(name.into()));
                    let v = match v {
                        Some(v) => v,
                        None => self.add(Node::Str("meta".into())),
                    };
                    self.set_item(d, k, v)?;
                }
                Ok(d)
            }
            Global::RebuildFromTypeV2 => {
                // (func, new_type, args, state): func(*args), then Python attributes from
                // `state`, which are not data and are left out.
                let [func, ty, inner, state] = args else {
                    return Err(bad(self, "expected (func, type, args, state)"));
                };
                if !matches!(
                    self.nodes[*ty],
                    Node::Global(Global::TensorClass | Global::ParameterClass, _)
                ) {
                    return Err(bad(
                        self,
                        "only torch.Tensor and torch.nn.Parameter types are data-only",
                    ));
                }
                if !matches!(
                    self.nodes[*state],
                    Node::Dict(_) | Node::None | Node::Tuple(_)
                ) {
                    return Err(bad(self, "state must be a dict of attributes"));
                }
                if matches!(
                    self.nodes[*func],
                    Node::Global(Global::RebuildFromTypeV2, _)
                ) {
                    return Err(bad(self, "nested in itself"));
                }
                let t = self.call(*func, *inner)?;
                match self.nodes[t] {
                    Node::Tensor(_) => Ok(t),
                    ref other => Err(bad(
                        self,
                        &format!("rebuilt a {}, not a tensor", other.kind()),
                    )),
                }
            }
            Global::RebuildDeviceTensor => match args.first() {
                Some(&t) if matches!(self.nodes[t], Node::Tensor(_)) => Ok(t),
                _ => Err(bad(self, "first argument must be a tensor")),
            },
            Global::ParameterClass => match args.first() {
                Some(&t) if matches!(self.nodes[t], Node::Tensor(_)) => Ok(t),
                _ => Err(bad(self, "first argument must be a tensor")),
            },
            Global::GetLayout => match args {
                [s] => match &self.nodes[*s] {
                    Node::Str(l) if l.starts_with("torch.sparse_") || l == "torch.strided" => {
                        let l = l.clone();
                        Ok(self.add(Node::Str(l)))
                    }
                    _ => Err(bad(self, "argument must name a torch layout")),
                },
                _ => Err(bad(self, "expected one string")),
            },
            Global::Device => {
                let s = match args {
                    [t] => self.str_arg(*t),
                    [t, i] => match (self.str_arg(*t), &self.nodes[*i]) {
                        (Some(t), Node::Int(i)) => Some(format!("{t}:{i}")),
                        (Some(t), Node::None) => Some(t),
                        _ => None,
                    },
                    _ => None,
                };
                let s = s.ok_or_else(|| bad(self, "expected (type[, index])"))?;
                Ok(self.add(Node::Str(s)))
            }
            Global::Complex => {
                let part = |u: &Self, i: Option<&Id>| match i.map(|&i| &u.nodes[i]) {
                    None => Some(0.0),
                    Some(Node::Float(f)) => Some(*f),
                    Some(Node::Int(i)) => Some(*i as f64),
                    Some(Node::Bool(b)) => Some(*b as u8 as f64),
                    _ => None,
                };
                match (
                    args.len(),
                    part(self, args.first()),
                    part(self, args.get(1)),
                ) {
                    (0..=2, Some(re), Some(im)) => {
                        let re = self.add(Node::Float(re));
                        let im = self.add(Node::Float(im));
                        self.new_tuple(vec![re, im])
                    }
                    _ => Err(bad(self, "expected (real, imag) numbers")),
                }
            }
            Global::Counter => {
                let d = self.new_dict()?;
                match args {
                    [] => {}
                    [src] => {
                        let Node::Dict(src) = &self.nodes[*src] else {
                            return Err(bad(self, "argument must be a dict"));
                        };
                        for (k, v) in src.items.clone() {
                            self.set_item(d, k, v)?;
                        }
                    }
                    _ => return Err(bad(self, "expected at most one argument")),
                }
                Ok(d)
            }
            _ => Err(bad(self, "this object cannot be called")),
        }
    }

    fn str_arg(&self, id: Id) -> Option<String> {
        match &self.nodes[id] {
            Node::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// `(bytes, dtype, key)` of a storage argument.
    fn storage_of(&self, id: Id, gname: &str) -> Result<(Bytes, DType, String), FormatError> {
        match &self.nodes[id] {
            Node::Storage(st) => Ok((st.bytes.clone(), st.dtype, st.key.clone())),
            other => Err(self.err(format!(
                "{gname}: first argument must be a storage, found {}",
                other.kind()
            ))),
        }
    }

    /// The view `(storage, offset, size, stride, …)` of `args` as a `dtype` tensor.
    fn strided(&self, args: &[Id], dtype: DType, gname: &str) -> Result<Tensor, FormatError> {
        let (bytes, _, key) = self.storage_of(args[0], gname)?;
        let offset = self.int_arg(args[1], "storage offset")?;
        let shape = self.int_tuple(args[2], "size")?;
        let strides = self.int_tuple(args[3], "stride")?;
        Tensor::from_parts(dtype, shape, strides, offset, bytes, Some(key.clone()))
            .map_err(|e| self.err(format!("{gname}: {dtype} tensor over storage {key}: {e}")))
    }

    /// `(qscheme, scale, zero_point)` or `(qscheme, scales, zero_points, axis)`, as torch's
    /// `_rebuild_qtensor` reads them; the symmetric schemes it refuses are refused.
    fn quantizer(&self, id: Id, gname: &str) -> Result<Quantization, FormatError> {
        let bad = |why: &str| self.err(format!("{gname}: quantizer parameters {why}"));
        let items = self.seq(id).ok_or_else(|| bad("are not a tuple"))?;
        let scheme = match items.first().map(|&i| &self.nodes[i]) {
            Some(Node::Global(Global::QScheme, n)) => n.trim_start_matches("torch.").to_string(),
            _ => return Err(bad("do not start with a torch qscheme")),
        };
        let float = |i: Id| match self.nodes[i] {
            Node::Float(f) => Some(f),
            Node::Int(v) => Some(v as f64),
            _ => None,
        };
        match (scheme.as_str(), &items[1..]) {
            ("per_tensor_affine", &[s, z]) => {
                let scale = float(s).ok_or_else(|| bad("have a non-number scale"))?;
                let zp = match self.nodes[z] {
                    Node::Int(v) => v,
                    _ => return Err(bad("have a non-integer zero point")),
                };
                Ok(Quantization {
                    scheme,
                    scales: vec![scale],
                    zero_points: vec![zp as f64],
                    axis: None,
                })
            }
            ("per_channel_affine" | "per_channel_affine_float_qparams", &[s, z, axis]) => {
                let (Node::Tensor(s), Node::Tensor(z)) = (&self.nodes[s], &self.nodes[z]) else {
                    return Err(bad("have scales or zero points that are not tensors"));
                };
                if s.numel() != z.numel() || s.dtype().is_complex() || z.dtype().is_complex() {
                    return Err(bad("have scales and zero points of different lengths"));
                }
                let axis = self.int_arg(axis, "quantization axis")?;
                Ok(Quantization {
                    scheme,
                    scales: s.to_f64_vec(),
                    zero_points: z.to_f64_vec(),
                    axis: Some(axis),
                })
            }
            (s, _) => Err(bad(&format!(
                "name qscheme {s} with {} values, which torch cannot deserialize",
                items.len() - 1
            ))),
        }
    }
}
