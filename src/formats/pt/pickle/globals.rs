//! The globals the unpickler accepts, by `module.name`.

use crate::tensor::DType;

/// The globals this reader accepts; each is a tag that REDUCE interprets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Global {
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
    RebuildTensorV3,
    RebuildQTensor,
    RebuildSparseTensor,
    RebuildMetaTensor,
    RebuildWrapperSubclass,
    RebuildFromTypeV2,
    /// `_rebuild_device_tensor_from_cpu_tensor` / `_from_numpy`: the tensor is the data.
    RebuildDeviceTensor,
    /// `torch.storage.UntypedStorage`: bytes, given a dtype by `_rebuild_tensor_v3`.
    UntypedStorage,
    /// A `torch.<dtype>` object; `None` for dtypes with no storage (`torch.int4`).
    Dtype(Option<DType>),
    /// `torch.per_tensor_affine` and the other quantization schemes.
    QScheme,
    /// `torch.serialization._get_layout`, which names a sparse layout.
    GetLayout,
    Device,
    Complex,
    Counter,
    /// `torch.Tensor` and `torch.nn.parameter.Parameter`, the classes
    /// `_rebuild_from_type_v2` and NEWOBJ name.
    TensorClass,
    ParameterClass,
    /// A producer's class or function named in [`DATA_CLASSES`]: calling it makes the dict
    /// `{"__class__": name, "__args__": args}` and BUILD adds its state (see
    /// `calls.rs::data_object`); nothing is imported or run.
    DataClass,
    /// `builtins.getattr`, accepted only as protocol 2's spelling of a nested class
    /// (`getattr(Sample, "Status")`) whose full name is in [`DATA_CLASSES`].
    Getattr,
}

/// The producers' classes (and one rebuild function) whose pickles are read as data: a
/// call records the name and the arguments, BUILD records the state. They are named one by
/// one, never by module, so that any other global is still refused.
/// - `verl.protocol.DataProto`: `DataProto.save_to_disk` pickles the object; its state is
///   `(batch as torch.save bytes | numpy encoding, non_tensor_batch, meta_info)`
///   (verl 0.9.1 `verl/protocol.py`, `__getstate__`).
/// - `tensordict._reductions._rebuild_tensordict_files_consolidated(metadata, storage)`:
///   how a consolidated `TensorDict` (verl's batch) pickles (tensordict `_reductions.py`,
///   `_reduce_td`).
/// - slime's (and Miles') `Sample` and its nested `Status` enum, `SpecInfo` and
///   `PrefixCacheInfo` dataclasses (THUDM/slime 624b824a `slime/utils/types.py`): debug
///   dumps hold `Sample.to_dict()` dicts, which some versions (cab4494f) left holding a
///   `SpecInfo` object, and users save `Sample`s themselves.
pub(super) const DATA_CLASSES: &[(&str, &str)] = &[
    ("verl.protocol", "DataProto"),
    ("slime.utils.types", "Sample"),
    ("slime.utils.types", "Sample.Status"),
    ("slime.utils.types", "Sample.SpecInfo"),
    ("slime.utils.types", "Sample.PrefixCacheInfo"),
    ("miles.utils.types", "Sample"),
    ("miles.utils.types", "Sample.Status"),
    ("miles.utils.types", "Sample.SpecInfo"),
    ("miles.utils.types", "Sample.PrefixCacheInfo"),
    (
        "tensordict._reductions",
        "_rebuild_tensordict_files_consolidated",
    ),
];

/// The accepted global `module.name`, or `None` when it must be refused.
pub(super) fn lookup_global(module: &str, name: &str) -> Option<Global> {
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
        ("torch" | "torch.cuda", n) if storage_dtype(n).is_some() => {
            Global::Storage(storage_dtype(n)?)
        }
        ("torch._utils", "_rebuild_tensor_v3") => Global::RebuildTensorV3,
        ("torch._utils", "_rebuild_qtensor") => Global::RebuildQTensor,
        ("torch._utils", "_rebuild_sparse_tensor") => Global::RebuildSparseTensor,
        ("torch._utils", "_rebuild_meta_tensor_no_storage") => Global::RebuildMetaTensor,
        ("torch._utils", "_rebuild_wrapper_subclass") => Global::RebuildWrapperSubclass,
        ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor")
        | ("torch._utils", "_rebuild_device_tensor_from_numpy") => Global::RebuildDeviceTensor,
        ("torch._tensor", "_rebuild_from_type_v2") => Global::RebuildFromTypeV2,
        ("torch.storage", "UntypedStorage") => Global::UntypedStorage,
        ("torch", n) if DType::from_torch_name(n).is_some_and(|d| d.torch_name() == n) => {
            Global::Dtype(DType::from_torch_name(n))
        }
        ("torch", n) if is_storageless_dtype(n) => Global::Dtype(None),
        (
            "torch",
            "per_tensor_affine"
            | "per_tensor_symmetric"
            | "per_channel_affine"
            | "per_channel_symmetric"
            | "per_channel_affine_float_qparams",
        ) => Global::QScheme,
        ("torch.serialization", "_get_layout") => Global::GetLayout,
        ("torch", "device") => Global::Device,
        ("builtins" | "__builtin__", "complex") => Global::Complex,
        ("collections", "Counter") => Global::Counter,
        ("torch", "Tensor") => Global::TensorClass,
        ("torch.nn.parameter", "Parameter") => Global::ParameterClass,
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
        (m, n) if DATA_CLASSES.contains(&(m, n)) => Global::DataClass,
        ("builtins" | "__builtin__", "getattr") => Global::Getattr,
        _ => return None,
    };
    Some(g)
}

/// The element type of a legacy typed storage class (`torch.ComplexFloatStorage`), also
/// under `torch.cuda` as old GPU checkpoints name them.
fn storage_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "FloatStorage" => DType::F32,
        "DoubleStorage" => DType::F64,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ShortStorage" => DType::I16,
        "CharStorage" => DType::I8,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        "ComplexFloatStorage" => DType::C64,
        "ComplexDoubleStorage" => DType::C128,
        "QInt8Storage" => DType::QInt8,
        "QUInt8Storage" => DType::QUInt8,
        "QInt32Storage" => DType::QInt32,
        "QUInt4x2Storage" => DType::QUInt4x2,
        "QUInt2x4Storage" => DType::QUInt2x4,
        _ => return None,
    })
}

/// The sub-byte integer dtypes (`torch.int1` … `torch.uint7`) torch's safe loader names
/// as globals although no tensor of them can be saved.
fn is_storageless_dtype(name: &str) -> bool {
    matches!(name.strip_prefix("uint").or_else(|| name.strip_prefix("int")),
        Some(d) if d.len() == 1 && (b'1'..=b'7').contains(&d.as_bytes()[0]))
}

/// The full name of a [`DATA_CLASSES`] entry, when `full` is one.
pub(super) fn is_data_class(full: &str) -> bool {
    DATA_CLASSES
        .iter()
        .any(|(m, n)| full.strip_prefix(m).and_then(|r| r.strip_prefix('.')) == Some(n))
}
