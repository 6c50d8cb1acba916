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
}

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
