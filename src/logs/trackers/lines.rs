//! Line-oriented tracker files (CSV tables, MLflow metric files) parsed in parallel: the
//! input is read in chunks cut after a newline, each chunk split at newlines into parts
//! parsed on the rayon pool (their rows with part-local line numbers and key ids), and
//! the parts handed back in file order while the next chunk is read and parsed.

use std::io::Read;

use crate::error::Result;

/// Bytes read at a time (the last line of a chunk is carried to the next one).
pub(super) const CHUNK: usize = 1 << 22;

/// Bytes per part parsed on one worker (cut at the next newline).
pub(super) const PART: usize = 1 << 18;

/// What [`parse_parts`]'s `add` wants after a part.
pub(super) enum Flow {
    /// Go on with the next part.
    Go,
    /// Stop before this part: the caller reads the rest itself.
    Stop,
}

/// How [`parse_parts`] ended.
pub(super) enum Ended<R> {
    /// Every byte was parsed and added.
    Eof,
    /// `add` stopped at a part: the bytes from that part's start on that were already
    /// read, and the input after them.
    Stopped(Vec<u8>, R),
}

/// Read more of `r` into `buf` until it holds at least `want` bytes or the input ends;
/// true at the end of the input.
fn fill<R: Read>(r: &mut R, buf: &mut Vec<u8>, want: usize) -> std::io::Result<bool> {
    while buf.len() < want {
        let more = (want - buf.len()) as u64;
        let got = r.by_ref().take(more).read_to_end(buf)?;
        if got == 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The end of each part of `data` (`part` bytes or more, up to and including a newline;
/// the last part ends at `data`'s end).
fn part_ends(data: &[u8], part: usize) -> Vec<usize> {
    let mut ends = Vec::with_capacity(data.len() / part.max(1) + 1);
    let mut at = 0usize;
    while at < data.len() {
        let want = (at + part.max(1)).min(data.len());
        let end = match data.get(want - 1..).and_then(|t| memchr::memchr(b'\n', t)) {
            Some(i) => want + i,
            None => data.len(),
        };
        ends.push(end);
        at = end;
    }
    ends
}

/// Parse the parts of `data` (ending at `ends`) in parallel, in order.
fn parse_chunk<P: Send>(
    data: &[u8],
    ends: &[usize],
    parse: &(dyn Fn(&[u8]) -> P + Sync),
) -> Vec<P> {
    use rayon::prelude::*;
    (0..ends.len())
        .into_par_iter()
        .map(|i| {
            let start = if i == 0 { 0 } else { ends[i - 1] };
            let part = data.get(start..ends[i]).unwrap_or_default();
            parse(part)
        })
        .collect()
}

/// A parsed chunk waiting to be added: its bytes, where its parts end, the parts.
struct Parsed<P> {
    data: Vec<u8>,
    ends: Vec<usize>,
    parts: Vec<P>,
}

/// Add `parsed`'s parts in order; on [`Flow::Stop`], the bytes from the stopping part on.
fn add_chunk<P>(
    parsed: &mut Option<Parsed<P>>,
    add: &mut dyn FnMut(P) -> Result<Flow>,
) -> Result<Option<Vec<u8>>> {
    let Some(p) = parsed.as_mut() else {
        return Ok(None);
    };
    let mut start = 0usize;
    for (part, &end) in std::mem::take(&mut p.parts).into_iter().zip(&p.ends) {
        if let Flow::Stop = add(part)? {
            return Ok(Some(p.data.get(start..).unwrap_or_default().to_vec()));
        }
        start = end;
    }
    Ok(None)
}

/// Read `input` (after the bytes `head`, already read from it) line by line in parallel:
/// chunks of `chunk` bytes cut after their last newline (a longer line makes its chunk
/// longer), each split into parts of about `part` bytes ending in a newline (but the
/// input's last, which may lack it), parsed with `parse` on the pool. `add` takes the
/// parsed parts in file order while the next chunk is read and parsed; it may stop the
/// reading before a part ([`Ended::Stopped`]).
pub(super) fn parse_parts<R: Read, P: Send>(
    mut input: R,
    head: Vec<u8>,
    (chunk, part): (usize, usize),
    parse: &(dyn Fn(&[u8]) -> P + Sync),
    add: &mut dyn FnMut(P) -> Result<Flow>,
) -> std::io::Result<Result<Ended<R>>> {
    let chunk = chunk.max(1);
    let mut buf = head;
    let mut spare: Vec<u8> = Vec::new();
    let mut eof = fill(&mut input, &mut buf, chunk)?;
    let mut pending: Option<Parsed<P>> = None;
    loop {
        // Cut the buffer after its last newline (a line longer than the buffer is read
        // whole first); the rest starts the next buffer.
        let cut = loop {
            match memchr::memrchr(b'\n', &buf) {
                _ if eof => break buf.len(),
                Some(i) => break i + 1,
                None => {
                    let want = buf.len() + chunk;
                    eof = fill(&mut input, &mut buf, want)?;
                }
            }
        };
        if cut == 0 {
            return Ok(match add_chunk(&mut pending, add) {
                Ok(Some(rest)) => Ok(Ended::Stopped(rest, input)),
                Ok(None) => Ok(Ended::Eof),
                Err(e) => Err(e),
            });
        }
        let mut next = std::mem::take(&mut spare);
        next.clear();
        next.extend_from_slice(buf.get(cut..).unwrap_or_default());
        buf.truncate(cut);
        let ends = part_ends(&buf, part);
        let mut parts = Vec::new();
        let mut added = Ok(None);
        let mut read = Ok(eof);
        rayon::in_place_scope(|s| {
            let (parts, data, ends) = (&mut parts, &buf, &ends);
            s.spawn(move |_| *parts = parse_chunk(data, ends, parse));
            added = add_chunk(&mut pending, add);
            if matches!(added, Ok(None)) && !eof {
                read = fill(&mut input, &mut next, chunk);
            }
        });
        match added {
            Err(e) => return Ok(Err(e)),
            Ok(Some(mut rest)) => {
                // Stopped: what was read after the stopping part goes back with it.
                rest.extend_from_slice(&buf);
                rest.extend_from_slice(&next);
                return Ok(Ok(Ended::Stopped(rest, input)));
            }
            Ok(None) => {}
        }
        eof = read?;
        if let Some(p) = pending.take() {
            spare = p.data;
        }
        pending = Some(Parsed {
            data: std::mem::replace(&mut buf, next),
            ends,
            parts,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk and part size gives the same parts' bytes back, in order.
    #[test]
    fn parts_cover_the_input_in_order_at_every_size() {
        let text = b"a,1\nbb,22\n\nccc,333\nlast";
        for chunk in 1..text.len() + 2 {
            for part in 1..text.len() + 2 {
                let parse = |b: &[u8]| b.to_vec();
                let mut got: Vec<u8> = Vec::new();
                let ended = parse_parts(
                    &text[3..],
                    text[..3].to_vec(),
                    (chunk, part),
                    &parse,
                    &mut |b| {
                        assert!(b.ends_with(b"\n") || got.len() + b.len() == text.len());
                        got.extend_from_slice(&b);
                        Ok(Flow::Go)
                    },
                );
                assert!(matches!(ended, Ok(Ok(Ended::Eof))));
                assert_eq!(got, text, "chunk {chunk} part {part}");
            }
        }
    }

    /// A stop hands back every byte from the stopping part on.
    #[test]
    fn stop_hands_back_the_rest() {
        let text = b"1\n2\n3\nstop\n5\n6\n7";
        for chunk in 1..text.len() + 2 {
            for part in 1..4 {
                let parse = |b: &[u8]| b.to_vec();
                let mut got: Vec<u8> = Vec::new();
                let ended = parse_parts(&text[..], Vec::new(), (chunk, part), &parse, &mut |b| {
                    if b.windows(4).any(|w| w == b"stop") {
                        return Ok(Flow::Stop);
                    }
                    got.extend_from_slice(&b);
                    Ok(Flow::Go)
                });
                let Ok(Ok(Ended::Stopped(mut rest, mut r))) = ended else {
                    panic!("not stopped");
                };
                r.read_to_end(&mut rest).unwrap();
                got.extend_from_slice(&rest);
                assert_eq!(got, text, "chunk {chunk} part {part}");
            }
        }
    }
}
