//! Shared, immutable storage bytes (an owned buffer or a memory map) behind tensors.

use std::fmt;
use std::sync::Arc;

/// Immutable bytes shared between tensors: an owned buffer or a memory map, plus a window.
#[derive(Clone)]
pub struct Bytes {
    buf: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl Bytes {
    /// Own a buffer.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Bytes {
            buf: Arc::new(v),
            start: 0,
            len,
        }
    }

    /// A window `[start, start+len)` of a shared buffer (e.g. a memory-mapped file);
    /// `None` when the window does not fit in the buffer.
    pub fn window(
        buf: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<Self> {
        let total = (*buf).as_ref().len();
        let end = start.checked_add(len)?;
        (end <= total).then_some(Bytes { buf, start, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.buf).as_ref()[self.start..self.start + self.len]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-window `[start, start+len)` of these bytes; `None` when it does not fit.
    pub fn slice(&self, start: usize, len: usize) -> Option<Bytes> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| Bytes {
            buf: self.buf.clone(),
            start: self.start + start,
            len,
        })
    }

    /// True when `self` and `other` are windows of the same buffer (one torch storage).
    pub fn same_buffer(&self, other: &Bytes) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.buf), Arc::as_ptr(&other.buf))
            && self.start == other.start
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len)
    }
}
