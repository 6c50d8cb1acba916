//! Text lines in file order into records and events (micro diagnostics and warnings
//! attached to the step reported next, unnumbered lines numbered, wrapped lines joined).

use super::lines::{verl_pairs, RECORD_CUT, RECORD_OPEN, RECORD_TAIL};
use super::TextItem;
use crate::logs::aliases::STAGE_FIELD;
use crate::model::log::{LogEvent, LogRecord, SourceKind};

/// A Megatron iteration whose loss the line left out (read as NaN): `nan-grad` says so.
pub const LOSS_UNPRINTED: &str = "loss_unprinted";

/// The text of an `exception` event whose traceback the file ends inside.
pub const CUT_TRACEBACK: &str = "(the log ends inside a traceback, before its exception line)";

/// A step's block of field lines: the step its banner named (none: opened by a section
/// title), the line it starts at, its fields.
type Block = (Option<i64>, u64, Vec<(String, f64)>);

/// Assembles parsed text lines in file order into records and events: micro diagnostics
/// and warnings attach to the next `iter N` line (they are printed before it), TRL dict
/// lines without a step are numbered in order.
#[derive(Debug, Default)]
pub struct TextAssembler {
    file: usize,
    pending_micro: Vec<(String, f64)>,
    pending_first_line: u64,
    pending_events: Vec<LogEvent>,
    last_step: Option<i64>,
    unnumbered: i64,
    /// The current table header's keys.
    table: Option<Vec<String>>,
    /// Table rows read so far: (step, record index), to recognise a second table of the
    /// same steps (a wider view of one run, pasted after the first).
    table_rows: Vec<(i64, usize)>,
    /// The last item was a verl console record (its index) with a key cut at the end.
    verl_tail: Option<(usize, String)>,
    /// A traceback began (its line) and its exception line has not come yet.
    traceback: Option<u64>,
    /// A record of this file named its step.
    numbered: bool,
    /// Metrics waiting for the next step line (DeepSpeed-Chat's timing line).
    pending_fields: Vec<(String, f64)>,
    /// Iterations of micro lines closed before any step line named them (a log of micro
    /// lines only, or one that reports every few iterations).
    closed_micro: Vec<(u64, Vec<(String, f64)>)>,
    /// The last micro line's micro index and clock (stage durations are clock differences).
    micro_clock: Option<(Option<u32>, f64)>,
    /// A dict record (its index) whose line ended after a whole pair: the next line of
    /// bare `'key': value` pairs continues it.
    open_dict: Option<usize>,
    /// The step a banner named (none: a block opened by a section title), its line, and
    /// the field lines read under it since.
    block: Option<Block>,
    /// The last line was a section title (its line and text): field lines next open a block.
    title: Option<(u64, String)>,
    /// The title that opened the current unnumbered block: it comes again at the next step.
    block_title: Option<String>,
    /// The block's current section is a timing breakdown (`⏱️  Timing:`): its `<name>_s`
    /// fields are stage times (`stage_s/<name>`), the total excepted.
    timing_section: bool,
    /// The count of the last tqdm bar line since the last record.
    last_bar: Option<i64>,
    /// Records numbered in order (their index) with the bar counts around them: the last
    /// bar before the record and the first after it.
    bar_steps: Vec<(usize, Option<i64>, Option<i64>)>,
    /// The fields of the last Megatron iteration line, in line order.
    megatron_prev: Option<Vec<(String, f64)>>,
    /// Field lines read before any banner (their line): the step before the first banner's
    /// when one comes next (a paste that starts inside an iteration).
    orphan: Option<(u64, Vec<(String, f64)>)>,
    /// Field lines with no step read while no record was: one record per line that repeats
    /// the keys before it, consecutive lines with new keys joined (the metrics of one step
    /// printed over several lines). Records of a file that never names a step.
    loose: Vec<Loose>,
    /// Records ready for the frame.
    pub records: Vec<LogRecord>,
    /// Events ready for the detectors.
    pub events: Vec<LogEvent>,
    /// Lines that matched nothing.
    pub unrecognised: u64,
    /// Of those, lines that are only a progress bar (`Episode [1/1]: 100%|…| 12/12 […]`).
    pub bars: u64,
}

/// Field lines read before any record: first line, last line, their fields.
type Loose = (u64, u64, Vec<(String, f64)>);

impl TextAssembler {
    /// An assembler for file index `file`.
    pub fn new(file: usize) -> Self {
        TextAssembler {
            file,
            ..TextAssembler::default()
        }
    }

    /// Feed the next line's item.
    pub fn push(&mut self, line: u64, item: TextItem) {
        let title = self.title.take();
        let verl_tail = self.verl_tail.take();
        let open_dict = self.open_dict.take();
        match item {
            TextItem::Blank => {
                self.verl_tail = verl_tail;
            }
            TextItem::Other => self.unrecognised += 1,
            TextItem::Bar(n) => {
                // not a record: counted with the lines read for nothing, as before
                self.unrecognised += 1;
                self.bars += 1;
                self.last_bar = Some(n);
                if let Some(b) = self.bar_steps.last_mut() {
                    if b.0 + 1 == self.records.len() && b.2.is_none() {
                        b.2 = Some(n);
                    }
                }
            }
            TextItem::Fatal(text) => {
                let mut ev = LogEvent::new("fatal", self.file, line);
                ev.text = Some(text);
                self.pending_events.push(ev);
            }
            TextItem::TableRule => {}
            TextItem::TableHeader(keys) => self.table = Some(keys),
            TextItem::TableRow(cells) => {
                let Some(keys) = &self.table else {
                    self.unrecognised += 1;
                    return;
                };
                // A row shorter than its header was cut: its last cell may be cut too.
                let n = if cells.len() < keys.len() {
                    cells.len().saturating_sub(1)
                } else {
                    keys.len()
                };
                let mut fields: Vec<(String, f64)> = keys
                    .iter()
                    .zip(&cells)
                    .take(n)
                    .filter_map(|(k, v)| v.map(|v| (k.clone(), v)))
                    .collect();
                let step = ["step", "epoch"].iter().find_map(|name| {
                    let i = fields.iter().position(|(k, _)| k == name)?;
                    let v = fields.get(i)?.1;
                    (v.fract() == 0.0 && v.is_finite()).then_some(v as i64)
                });
                fields.retain(|(k, _)| k != "step");
                if fields.is_empty() {
                    self.unrecognised += 1;
                    return;
                }
                if let Some(idx) = step.and_then(|s| self.same_row(s, &fields)) {
                    let rec = &mut self.records[idx];
                    for (k, v) in fields {
                        if !rec.fields.iter().any(|(rk, _)| *rk == k) {
                            rec.fields.push((k, v));
                        }
                    }
                    return;
                }
                if let Some(s) = step {
                    self.table_rows.push((s, self.records.len()));
                }
                self.push(
                    line,
                    TextItem::Step {
                        source: SourceKind::NotebookTable,
                        step,
                        fields,
                        tail: None,
                    },
                );
            }
            TextItem::Continuation(text) => match verl_tail {
                Some((idx, head)) => {
                    let (pairs, tail) = verl_pairs(&text, &head);
                    if let Some(rec) = self.records.get_mut(idx) {
                        // the pair cut at the line's end is read again whole
                        for (k, v) in pairs {
                            match rec.fields.iter_mut().find(|(rk, _)| *rk == k) {
                                Some(slot) => slot.1 = v,
                                None => rec.fields.push((k, v)),
                            }
                        }
                    }
                    // a step line wrapped over several lines: the next may continue it
                    self.verl_tail = Some((idx, tail));
                }
                None => self.unrecognised += 1,
            },
            TextItem::Warning(kind) => {
                self.pending_events
                    .push(LogEvent::new(kind, self.file, line));
            }
            TextItem::TracebackStart => {
                self.traceback.get_or_insert(line);
            }
            TextItem::Exception(text) => match self.traceback.take() {
                Some(_) => {
                    let mut ev = LogEvent::new("exception", self.file, line);
                    ev.text = Some(text);
                    self.pending_events.push(ev);
                }
                // An out-of-memory error is a crash even when its traceback was not
                // pasted (a console that prints only the last line).
                None if text.contains("OutOfMemoryError") || text.contains("out of memory") => {
                    let mut ev = LogEvent::new("exception", self.file, line);
                    ev.text = Some(text);
                    self.pending_events.push(ev);
                }
                None => self.unrecognised += 1,
            },
            TextItem::StepHeader(step) => {
                self.close_block();
                if let Some((at, fields)) = self.orphan.take() {
                    if self.records.is_empty() {
                        self.unrecognised -= 1;
                        self.push(
                            at,
                            TextItem::Step {
                                source: SourceKind::KvText,
                                step: Some(step - 1),
                                fields,
                                tail: None,
                            },
                        );
                    }
                }
                self.block = Some((Some(step), line, Vec::new()));
            }
            TextItem::Title(text) => {
                self.unrecognised += 1;
                self.timing_section = text.to_ascii_lowercase().contains("timing");
                if self.block_title.as_ref() == Some(&text) {
                    self.close_block();
                }
                if self.block.is_none() {
                    self.title = Some((line, text));
                }
            }
            TextItem::Fields(new) => {
                if let (None, Some((at, text))) = (&self.block, title) {
                    self.block = Some((None, at, Vec::new()));
                    self.block_title = Some(text);
                }
                let timing = self.timing_section;
                let Some((_, _, fields)) = &mut self.block else {
                    self.unrecognised += 1;
                    if self.records.is_empty() && new.len() >= 2 {
                        match self.loose.last_mut() {
                            // the metrics of one step printed over consecutive lines
                            Some((_, last, fields))
                                if *last + 1 == line
                                    && !new
                                        .iter()
                                        .any(|(k, _)| fields.iter().any(|(f, _)| f == k)) =>
                            {
                                *last = line;
                                fields.extend(new.iter().cloned());
                            }
                            _ => self.loose.push((line, line, new.clone())),
                        }
                        self.orphan = Some((line, new));
                    }
                    return;
                };
                fields.extend(new.into_iter().map(|(k, v)| {
                    let k = match k.strip_suffix("_s") {
                        Some(name) if timing && !name.starts_with("total") => {
                            format!("{STAGE_FIELD}{name}")
                        }
                        _ => k,
                    };
                    (k, v)
                }));
            }
            TextItem::Pending(fields) => self.pending_fields.extend(fields),
            TextItem::Attach(fields) => match self.records.last_mut() {
                Some(rec) => rec.fields.extend(fields),
                None => self.unrecognised += 1,
            },
            TextItem::Micro {
                mut fields,
                micro,
                stage,
                ends_iteration,
            } => {
                // A micro index lower than the last one starts the next iteration.
                let restarted = matches!(
                    (micro, self.micro_clock),
                    (Some(m), Some((Some(last), _))) if m < last
                );
                if restarted && !self.pending_micro.is_empty() {
                    self.close_micro();
                }
                if let Some((name, clock)) = stage {
                    let dur = match self.micro_clock {
                        Some((m, prev)) if m == micro && clock >= prev => clock - prev,
                        _ => clock,
                    };
                    fields.push((format!("{STAGE_FIELD}{name}"), dur));
                    self.micro_clock = Some((micro, clock));
                } else if micro.is_some() {
                    self.micro_clock = Some((micro, 0.0));
                }
                if self.pending_micro.is_empty() {
                    self.pending_first_line = line;
                }
                self.pending_micro.extend(fields);
                if ends_iteration {
                    self.close_micro();
                    self.micro_clock = None;
                }
            }
            TextItem::Step {
                source,
                step,
                mut fields,
                tail,
            } => {
                if self.block.as_ref().is_some_and(|b| b.1 != line) {
                    self.close_block();
                }
                // The parser's markers come last: most records have none.
                let has_markers = fields.last().is_some_and(|(k, _)| k.starts_with("__"));
                let marked = |fields: &[(String, f64)], m: &str| fields.iter().any(|(k, _)| k == m);
                let (open, tail_line) = if has_markers {
                    let marks = (marked(&fields, RECORD_OPEN), marked(&fields, RECORD_TAIL));
                    fields.retain(|(k, _)| k != RECORD_OPEN && k != RECORD_TAIL);
                    marks
                } else {
                    (false, false)
                };
                // The next line of a dict wrapped after a whole pair: its pairs join it.
                if let (true, Some(idx)) = (tail_line, open_dict) {
                    if let Some(rec) = self.records.get_mut(idx) {
                        rec.fields.extend(fields);
                    }
                    self.open_dict = open.then_some(idx);
                    return;
                }
                let cut = has_markers && fields.iter().any(|(k, _)| k == RECORD_CUT);
                if cut {
                    fields.retain(|(k, _)| k != RECORD_CUT);
                    // A cut record whose step was cut off, among numbered ones: no step to
                    // give it.
                    if step.is_none() && self.numbered {
                        self.unrecognised += 1;
                        return;
                    }
                }
                if source == SourceKind::Megatron {
                    self.megatron_unprinted(&mut fields);
                }
                self.numbered |= step.is_some();
                let (step, inferred) = match step {
                    Some(s) => (s, false),
                    None => {
                        self.unnumbered += 1;
                        (self.unnumbered - 1, true)
                    }
                };
                self.flush(step);
                fields.append(&mut self.pending_fields);
                let mut rec = LogRecord {
                    step: Some(step),
                    timestamp: None,
                    source,
                    file: self.file,
                    line,
                    fields,
                };
                if inferred {
                    rec.fields.push(("step_inferred".to_string(), 1.0));
                    if source == SourceKind::TrlDict {
                        self.bar_steps
                            .push((self.records.len(), self.last_bar, None));
                    }
                }
                self.last_bar = None;
                self.last_step = Some(step);
                if source == SourceKind::VerlConsole {
                    self.verl_tail = Some((self.records.len(), tail.unwrap_or_default()));
                }
                if open {
                    self.open_dict = Some(self.records.len());
                }
                self.records.push(rec);
            }
        }
    }

    /// What a Megatron iteration line says by leaving out (megatron/training.py
    /// `training_log`): a loss is printed only `if avg > 0.0`, and a skipped iteration adds
    /// nothing to it, so a NaN loss (`NaN > 0.0` is false) or an interval of skipped
    /// updates drops the loss key from the line (epfLLM/Megatron-LLM#33,
    /// deepspeedai/Megatron-DeepSpeed#434). A loss key the previous line printed, missing
    /// where a key that followed it is present, is a NaN loss here. `number of skipped
    /// iterations` > 0 without the fp16 loss scale dropping (bf16, or the scale at 1) is
    /// an update skipped on a non-finite gradient (`grad_nan_count`); a skip that halves
    /// the scale is the scaler's own calibration, not a failure.
    fn megatron_unprinted(&mut self, fields: &mut Vec<(String, f64)>) {
        let get = |f: &[(String, f64)], k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let skipped = get(fields, "number_of_skipped_iterations").unwrap_or(0.0);
        let scale = get(fields, "loss_scale");
        let prev = self.megatron_prev.take();
        let prev_scale = prev.as_deref().and_then(|p| get(p, "loss_scale"));
        let scaler_skip = match (scale, prev_scale) {
            (Some(s), Some(p)) => s < p,
            (Some(s), None) => s > 1.0,
            _ => false,
        };
        if let Some(prev) = &prev {
            if !(skipped > 0.0 && scaler_skip) {
                for (i, (k, v)) in prev.iter().enumerate() {
                    let is_loss = k.ends_with("loss") && *v > 0.0 && v.is_finite();
                    if is_loss
                        && get(fields, k).is_none()
                        && prev[i + 1..].iter().any(|(n, _)| get(fields, n).is_some())
                    {
                        fields.push((k.clone(), f64::NAN));
                        if get(fields, LOSS_UNPRINTED).is_none() {
                            fields.push((LOSS_UNPRINTED.to_string(), 1.0));
                        }
                    }
                }
            }
        }
        // No loss key on the line at all, none on the line before to compare with
        // (Megatron-DeepSpeed#434's only line, #396's run): the same `avg > 0.0` rule
        // hid it, unless updates of the interval were skipped (a skipped update adds no
        // loss: NVIDIA/nccl#743's first interval, `number of skipped iterations: 10` while
        // the fp16 scale drops from 2^32; Megatron-LLM#34's skip on a bad grad norm, which
        // `number_of_nan_iterations` below reports).
        let line_has_loss =
            |f: &[(String, f64)]| f.iter().any(|(k, v)| k.ends_with("loss") && v.is_finite());
        let megatron_line =
            scale.is_some() && get(fields, "number_of_skipped_iterations").is_some();
        // A finite gradient norm on the line says the backward pass saw a finite loss
        // (epfLLM/Megatron-LLM#34's iteration 3633: `grad norm: 0.794`, no loss printed).
        let finite_grad = get(fields, "grad_norm").is_some_and(f64::is_finite);
        if megatron_line
            && !finite_grad
            && !line_has_loss(fields)
            && !prev.as_deref().is_some_and(line_has_loss)
            && skipped == 0.0
            && get(fields, LOSS_UNPRINTED).is_none()
        {
            fields.push(("loss".to_string(), f64::NAN));
            fields.push((LOSS_UNPRINTED.to_string(), 1.0));
        }
        if skipped > 0.0 && !scaler_skip {
            match fields
                .iter_mut()
                .find(|(k, _)| k == "number_of_nan_iterations")
            {
                Some((_, v)) => *v = v.max(skipped),
                None => fields.push(("number_of_nan_iterations".to_string(), skipped)),
            }
        }
        self.megatron_prev = Some(fields.clone());
    }

    /// The record of an earlier table row at `step` whose values agree with `fields` on
    /// every key both have (at least one): the same row of the same run, seen again in a
    /// wider table (open-r1#704 pastes `Step | Training Loss | reward | … | kl` and then
    /// the same steps with twenty columns), not a restart.
    fn same_row(&self, step: i64, fields: &[(String, f64)]) -> Option<usize> {
        let &(_, idx) = self.table_rows.iter().rev().find(|(s, _)| *s == step)?;
        let rec = self.records.get(idx)?;
        let mut shared = 0;
        for (k, v) in fields {
            if let Some((_, w)) = rec.fields.iter().find(|(rk, _)| rk == k) {
                if !(v == w || (v.is_nan() && w.is_nan())) {
                    return None;
                }
                shared += 1;
            }
        }
        (shared > 0).then_some(idx)
    }

    /// The step of the last banner becomes a record of the field lines under it (none: no
    /// record; a banner alone says nothing about training).
    fn close_block(&mut self) {
        self.block_title = None;
        self.timing_section = false;
        if let Some((step, line, fields)) = self.block.take() {
            if !fields.is_empty() {
                self.push(
                    line,
                    TextItem::Step {
                        source: SourceKind::KvText,
                        step,
                        fields,
                        tail: None,
                    },
                );
            }
        }
    }

    /// Close the pending micro lines as one iteration not yet named by a step line.
    fn close_micro(&mut self) {
        if self.pending_micro.is_empty() {
            return;
        }
        let fields = std::mem::take(&mut self.pending_micro);
        self.closed_micro.push((self.pending_first_line, fields));
    }

    /// Attach pending micro lines and warnings to `step`; iterations closed before it
    /// (several per reported step) take the steps just before it.
    fn flush(&mut self, step: i64) {
        for mut ev in self.pending_events.drain(..) {
            ev.step = Some(step);
            self.events.push(ev);
        }
        self.close_micro();
        let closed = std::mem::take(&mut self.closed_micro);
        let n = closed.len() as i64;
        for (i, (line, fields)) in closed.into_iter().enumerate() {
            self.records.push(LogRecord {
                step: Some(step - (n - 1 - i as i64)),
                timestamp: None,
                source: SourceKind::MicroDiag,
                file: self.file,
                line,
                fields: aggregate_micro(fields),
            });
        }
    }

    /// Flush what is pending at end of file (to the step after the last one seen). A
    /// traceback the file ends inside (a log cut short, a paste) is an `exception` event
    /// saying so, at the traceback's first line.
    pub fn finish(&mut self) {
        self.close_block();
        // Metrics pasted with no step at all and nothing else read (autocontext#1067:
        // `completions/mean_length: 256   completions/clipped_ratio: 1 …` / `reward: 0
        // reward_std: 0 …`, one step over two lines): records of their own.
        let metrics = |f: &[(String, f64)]| {
            f.iter()
                .filter(|(k, _)| crate::logs::aliases::names_a_metric(k))
                .count()
        };
        // DeepRL-Grounding#7: `Time 08h 36m 42s, Avg Reward 0.064, Avg Accuracy 0.22, …`
        // every few minutes: one record per line, numbered in order.
        let loose = std::mem::take(&mut self.loose);
        if self.records.is_empty() && loose.iter().all(|l| metrics(&l.2) >= 1) {
            for (at, last, fields) in loose {
                self.unrecognised -= last + 1 - at;
                self.push(
                    at,
                    TextItem::Step {
                        source: SourceKind::KvText,
                        step: None,
                        fields,
                        tail: None,
                    },
                );
            }
            self.close_block();
        }
        if let Some(line) = self.traceback.take() {
            let mut ev = LogEvent::new("exception", self.file, line);
            ev.text = Some(CUT_TRACEBACK.to_string());
            self.pending_events.push(ev);
        }
        let next = self.last_step.map_or(0, |s| s.saturating_add(1));
        // Iterations no step line named (a log of micro lines only) are numbered on.
        self.close_micro();
        let extra = self.closed_micro.len().saturating_sub(1) as i64;
        self.flush(next.saturating_add(extra));
        self.number_by_bars();
    }

    /// Records numbered in order that all sit next to a tqdm bar line (an HF Trainer
    /// console: the bar shows step N, the record of step N is printed, the bar is redrawn
    /// at N) take the bars' counts as their steps when those increase; the events after
    /// them move along.
    fn number_by_bars(&mut self) {
        let inferred = self
            .records
            .iter()
            .filter(|r| r.fields.iter().any(|(k, _)| k == "step_inferred"))
            .count();
        if self.bar_steps.is_empty() || self.bar_steps.len() != inferred {
            return;
        }
        let Some(counts) = self
            .bar_steps
            .iter()
            .map(|(_, before, after)| before.or(*after))
            .collect::<Option<Vec<i64>>>()
        else {
            return;
        };
        if counts.windows(2).any(|w| w[1] <= w[0]) {
            return;
        }
        let mut map: Vec<(i64, i64)> = Vec::new();
        for ((idx, _, _), &n) in self.bar_steps.iter().zip(&counts) {
            let rec = &mut self.records[*idx];
            if let Some(old) = rec.step {
                map.push((old, n));
            }
            rec.step = Some(n);
            rec.fields.retain(|(k, _)| k != "step_inferred");
        }
        let (old_last, new_last) = match map.last() {
            Some(&(o, n)) => (o, n),
            None => return,
        };
        for ev in &mut self.events {
            if let Some(s) = ev.step {
                ev.step = Some(match map.iter().find(|(o, _)| *o == s) {
                    Some(&(_, n)) => n,
                    None if s > old_last => new_last + (s - old_last),
                    None => s,
                });
            }
        }
    }
}

/// Combine one iteration's micro diagnostics: stds and memory take the max (all-zero
/// std means every micro had identical rewards), everything else the mean.
fn aggregate_micro(fields: Vec<(String, f64)>) -> Vec<(String, f64)> {
    let mut keys: Vec<String> = Vec::new();
    let mut vals: Vec<Vec<f64>> = Vec::new();
    for (k, v) in fields {
        match keys.iter().position(|x| *x == k) {
            Some(i) => vals[i].push(v),
            None => {
                keys.push(k);
                vals.push(vec![v]);
            }
        }
    }
    keys.into_iter()
        .zip(vals)
        .map(|(k, vs)| {
            let take_max = k.ends_with("_std") || k.ends_with("_gb") || k == "step_time_s";
            let v = if take_max {
                vs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            } else if k.starts_with(STAGE_FIELD) {
                // A stage's time in the iteration: the sum over its micro-batches.
                vs.iter().sum::<f64>()
            } else {
                vs.iter().sum::<f64>() / vs.len() as f64
            };
            (k, v)
        })
        .collect()
}
