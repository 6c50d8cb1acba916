//! The streaming hook ([`Each`]): items of the root dict's list under a key handed over
//! as soon as they are built, and their memory freed, so a caller digesting trajectories
//! never holds the token lists of them all.

use super::*;

/// A streaming read's hook: each item appended to the list under key `key` of the
/// pickle's root dict (`{"trajectories": [t0, t1, …]}`) is handed, complete, to `each`
/// with its index in that list; what `each` returns takes its place, and the packed lists
/// inside the item are freed. `each` may refuse an item with a message (the read fails
/// at it).
pub struct Each<'f> {
    pub key: &'f str,
    pub each: &'f mut dyn FnMut(usize, Value) -> Result<Value, String>,
}

impl Unpickler<'_, '_, '_> {
    /// True when items appended to `list` go to the streaming hook: `list` is the value
    /// of the hook's key in the pickle's root dict, being filled (the stack holds the root
    /// dict, then its pending keys and values, the key and `list` last; no other MARK open).
    pub(super) fn each_target(&self, list: Id) -> bool {
        self.each_target_in(self.stack.len(), &self.marks, list)
    }

    /// [`Unpickler::each_target`] of the stack's first `n` entries under the MARKs `marks`.
    fn each_target_in(&self, n: usize, marks: &[usize], list: Id) -> bool {
        let Some(e) = &self.each else {
            return false;
        };
        n >= 3
            && (n - 1).is_multiple_of(2)
            && self.stack[n - 1] == list
            && matches!(self.nodes[list], Node::List(_))
            && matches!(self.nodes[self.stack[0]], Node::Dict(_))
            && marks.iter().all(|&m| m <= 1)
            && matches!(&self.nodes[self.stack[n - 2]], Node::Str(k) if k == e.key)
    }

    /// Called as a MARK opens: when the stack is the hook's list batch (`list MARK item0 …
    /// itemk`) and the MARK is itemk's own (a dict's `MARK k v … SETITEMS`), hand the dicts
    /// before itemk over now rather than at the batch's APPENDS, so the hook digests them
    /// while the rest is read (the pickler batches 1,000 items an APPENDS: a step's
    /// trajectories would otherwise all arrive at the end). Only the top of the stack can
    /// still change: a later SETITEMS/APPENDS/BUILD acts on the object below its MARK or on
    /// the top. A pickle that reaches a handed item again (a memo GET, a POP back to it)
    /// finds it released and fails, and the caller reads the file whole, as when an item is
    /// referenced twice.
    pub(super) fn hand_complete_items(&mut self) -> Result<(), FormatError> {
        if self.each.is_none() {
            return Ok(());
        }
        let Some((&m, outer)) = self.marks.split_last() else {
            return Ok(());
        };
        let n = self.stack.len();
        if m == 0 || n < m + 2 || !self.each_target_in(m, outer, self.stack[m - 1]) {
            return Ok(());
        }
        let list = self.stack[m - 1];
        // Items handed at an earlier MARK of this batch are `Kept` and come first.
        let end = n - 1;
        let mut start = end;
        while start > m && !matches!(self.nodes[self.stack[start - 1]], Node::Kept(_)) {
            start -= 1;
        }
        // Only dicts (NexRL's trajectories): an object item is built over several stack
        // entries (its class and arguments, then its state for BUILD), and handing its
        // first part now would hand it incomplete; such items wait for the APPENDS.
        let all_dicts = self.stack[start..end]
            .iter()
            .all(|&id| matches!(self.nodes[id], Node::Dict(_)));
        if start < end && all_dicts {
            let items = self.stack[start..end].to_vec();
            let kept = self.hand_items(list, items)?;
            self.stack[start..end].copy_from_slice(&kept);
            self.each_early += end - start;
        }
        Ok(())
    }

    /// At the end of the hook's list batch (`items`, popped from its MARK; `appends`: by
    /// APPENDS, else ADDITEMS): the items handed early must be exactly its first items. A
    /// dict that was only part of an item (`(d1, d2)`, built by TUPLE2 after both) was
    /// handed as one: fail, and the caller reads the file whole.
    pub(super) fn check_early(&mut self, items: &[Id], appends: bool) -> Result<(), FormatError> {
        let early = std::mem::take(&mut self.each_early);
        let kept = items
            .iter()
            .take_while(|&&id| matches!(self.nodes[id], Node::Kept(_)))
            .count();
        let stray = items[kept..]
            .iter()
            .any(|&id| matches!(self.nodes[id], Node::Kept(_)));
        if kept != early || stray || (early > 0 && !appends) {
            return Err(self.err(format!(
                "{early} item(s) handed over before the APPENDS are not the batch's first items"
            )));
        }
        Ok(())
    }

    /// The stack cannot tell the root dict's pending `key` from that of a one-item dict
    /// nested in it (both `… key [`): check at the end that the items handed over all went
    /// to the list under the root's key, else fail (the caller reads the file whole).
    pub(super) fn check_handed(&self, root: Id) -> Result<(), FormatError> {
        let Some(e) = &self.each else {
            return Ok(());
        };
        let at_key = match &self.nodes[root] {
            Node::Dict(d) => d
                .items
                .iter()
                .find(|&&(k, _)| matches!(&self.nodes[k], Node::Str(s) if s == e.key))
                .map(|&(_, v)| v),
            _ => None,
        };
        match self.each_lists.as_slice() {
            [] => Ok(()),
            [list] if at_key == Some(*list) => Ok(()),
            _ => Err(self.err(format!(
                "the items handed over are not all those of the root's {:?} list",
                e.key
            ))),
        }
    }

    /// Hand each of `items` (complete) to the hook; return the nodes of what it kept, the
    /// items' packed lists freed.
    pub(super) fn hand_items(&mut self, list: Id, items: Vec<Id>) -> Result<Vec<Id>, FormatError> {
        if !self.each_lists.contains(&list) {
            self.each_lists.push(list);
        }
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            // Handed already, at a MARK of the batch (`hand_complete_items`).
            if matches!(self.nodes[item], Node::Kept(_)) {
                kept.push(item);
                continue;
            }
            let mut budget = match self.each_budget.take() {
                Some(b) => b,
                None => self.full_budget(),
            };
            let v = self.materialize_in(item, &mut budget);
            self.each_budget = Some(budget);
            let v = v?;
            let index = self.each_count;
            self.each_count += 1;
            let out = match self.each.as_mut() {
                Some(e) => (e.each)(index, v),
                None => Ok(v),
            };
            let out = out.map_err(|m| self.err(m))?;
            self.release_packed_under(item);
            kept.push(self.add(Node::Kept(Box::new(out))));
        }
        Ok(kept)
    }

    /// Free what the item at `root` holds (its containers and packed lists, not the keys
    /// and scalars other items share through the memo): anything reading them later fails
    /// instead of reading other values.
    fn release_packed_under(&mut self, root: Id) {
        let mut todo = vec![root];
        while let Some(id) = todo.pop() {
            match std::mem::replace(&mut self.nodes[id], Node::Released) {
                Node::List(v) | Node::Tuple(v) => todo.extend(v),
                Node::Dict(d) => todo.extend(d.items.iter().map(|&(_, v)| v)),
                Node::Packed(_) | Node::Released => {}
                other => self.nodes[id] = other,
            }
        }
    }
}
