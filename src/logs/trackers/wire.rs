//! Protobuf wire-format walking over borrowed bytes, for the hot paths of the event-file
//! and `.wandb` readers: a record is read without allocating its keys and values (prost's
//! derived decoders allocate every string). Any surprise returns `None` and the caller
//! decodes the record with prost instead, which reports the error.

/// A varint at `*pos`.
#[inline(always)]
pub fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    // One byte (tags, short lengths, small values: most varints of a record) first.
    if let Some(&byte) = b.get(*pos) {
        if byte < 0x80 {
            *pos += 1;
            return Some(u64::from(byte));
        }
    }
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        // The tenth byte holds bit 63 only (prost refuses more).
        if shift == 63 && byte > 1 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// One field's payload: a varint value, or the bytes of a fixed-size (`Fixed64`,
/// `Fixed32`) or length-delimited (`Bytes`) field.
pub enum Payload<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1 (8 bytes).
    Fixed64(&'a [u8]),
    /// Wire type 2.
    Bytes(&'a [u8]),
    /// Wire type 5 (4 bytes).
    Fixed32(&'a [u8]),
}

/// `n` bytes at `*pos`.
#[inline(always)]
fn take<'a>(b: &'a [u8], pos: &mut usize, n: usize) -> Option<&'a [u8]> {
    let s = b.get(*pos..pos.checked_add(n)?)?;
    *pos += n;
    Some(s)
}

/// The next field at `*pos`: its number and payload (`None` for group wire types or a
/// field running past the end).
#[inline(always)]
pub fn field<'a>(b: &'a [u8], pos: &mut usize) -> Option<(u64, Payload<'a>)> {
    let tag = varint(b, pos)?;
    let (num, wt) = (tag >> 3, tag & 7);
    if num == 0 || tag > u64::from(u32::MAX) {
        return None;
    }
    let p = match wt {
        0 => Payload::Varint(varint(b, pos)?),
        1 => Payload::Fixed64(take(b, pos, 8)?),
        2 => {
            let n = usize::try_from(varint(b, pos)?).ok()?;
            Payload::Bytes(take(b, pos, n)?)
        }
        5 => Payload::Fixed32(take(b, pos, 4)?),
        _ => return None,
    };
    Some((num, p))
}
