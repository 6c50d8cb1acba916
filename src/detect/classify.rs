//! Known crash signatures: what the exception text says, what it means in a GRPO/GSPO run,
//! and the usual fix. An exception no signature matches is reported as `unknown`, shown
//! plainly, never guessed at.

/// A crash signature's verdict.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Classification {
    /// Stable id: `empty-array`, `nan-gradient`, `oom`, `collective-timeout`,
    /// `shape-mismatch`, `chat-template`, `unknown`.
    pub id: &'static str,
    /// A short title.
    pub title: &'static str,
    /// What happened, in a sentence or two.
    pub explanation: String,
    /// The usual fixes, most likely first.
    pub fixes: Vec<&'static str>,
    /// The text that matched (empty for `unknown`).
    pub matched: String,
}

struct Signature {
    id: &'static str,
    title: &'static str,
    /// Lower-case substrings; any one matches.
    needles: &'static [&'static str],
    explanation: &'static str,
    fixes: &'static [&'static str],
}

/// The signatures, tried in order (the first match wins).
const SIGNATURES: &[Signature] = &[
    Signature {
        id: "empty-array",
        title: "Zero-length completion reached a reduction",
        needles: &[
            "received empty array",
            "zero-size array to reduction",
            "cannot reshape tensor of 0 elements",
        ],
        explanation: "A completion came back with no token (the sampler emitted EOS first), so the per-token log-probability slice for that row was empty and `logsumexp` over it raised. Token-level importance sampling takes a log-softmax per token and is the path that breaks.",
        fixes: &[
            "Keep the DebugTrainer's sequence-level fallback on (drop `--debug-no-sequence-fallback`), or train with `--importance-sampling-level sequence`.",
            "Force a minimum completion length: `--debug-min-new-tokens 2` (or the sampler's min_tokens).",
            "Mask empty rows out of the loss (length − 1 ≤ 0) instead of slicing them.",
            "Check the rows listed under empty_indices: prompts that make the model stop at once often have a broken chat template.",
        ],
    },
    Signature {
        id: "nan-gradient",
        title: "NaN in the gradients",
        needles: &[
            "floatingpointerror",
            "nans in gradients",
            "nan in gradients",
            "returned nan values",
            "loss is nan",
            "non-finite loss",
            "detected nan",
        ],
        explanation: "The gradients held NaN entries and the trainer stopped before the optimizer applied them. Usual sources: a learning rate too high for the run (grad norm climbing first), advantages divided by a near-zero reward std, a log-ratio overflowing in exp, or a NaN reward.",
        fixes: &[
            "Lower the learning rate (and add warm-up); watch grad_norm in the plot before the crash.",
            "Clip gradients (max grad norm 1.0) and clamp the log-ratio before exp (±20).",
            "Add epsilon to the reward std in the advantage (1e-4) and check rewards for NaN.",
            "Replay the step with the same seed to see which micro-batch produces the first NaN.",
        ],
    },
    Signature {
        id: "oom",
        title: "Out of GPU memory",
        needles: &[
            "out of memory",
            "outofmemoryerror",
            "insufficient memory",
            "kiogpucommandbuffercallbackerroroutofmemory",
            "[malloc_or_wait] unable to allocate",
            "unable to allocate",
            "std::bad_alloc",
            "exceeds the maximum allowed buffer size",
        ],
        explanation: "The device ran out of memory. In GRPO memory scales with batch size × group size × (prompt + completion length); a slow climb in peak memory over steps points at a leak (retained graphs, caches not cleared), a sudden jump at the crash points at one long batch.",
        fixes: &[
            "Reduce batch size or group size, or cap max completion length.",
            "Enable gradient checkpointing (`--grad-checkpoint`) or use gradient accumulation.",
            "If peak memory grew step after step, clear caches each step (mx.clear_cache / torch.cuda.empty_cache) and do not keep tensors from earlier steps.",
            "On Metal, raise the wired limit only if the machine has the memory.",
        ],
    },
    Signature {
        id: "collective-timeout",
        title: "Collective operation timed out (NCCL / distributed)",
        needles: &[
            "watchdog caught collective operation timeout",
            // a paste cut inside the watchdog's message
            "watchdog caught collective",
            "nccl",
            "distbackenderror",
            "collective operation timeout",
            "timed out in collective",
            "processgroupgloo",
        ],
        explanation: "A rank waited for the others in an all-reduce/all-gather and gave up. One rank is slower or stuck (uneven generation lengths, a crash on another rank, a different number of micro-batches per rank), or the network failed.",
        fixes: &[
            "Look for an earlier crash on another rank: the timeout is usually a symptom.",
            "Make every rank run the same number of collectives (same micro-batch count, no rank-dependent early exit).",
            "Raise the process-group timeout only after ruling out a hang; set NCCL_DEBUG=INFO to see which collective.",
        ],
    },
    Signature {
        id: "shape-mismatch",
        title: "Tensor shape mismatch",
        needles: &[
            "shapes cannot be multiplied",
            "cannot be broadcast",
            "size mismatch",
            "must match the size of tensor",
            "[broadcast_shapes]",
            "[matmul]",
            "shape mismatch",
            "incompatible shapes",
        ],
        explanation: "Two tensors that should line up did not. In GRPO the usual cause is completions padded to different lengths in two places (policy vs reference log-probs, mask vs log-probs), or a group size that does not divide the batch.",
        fixes: &[
            "Compare the shapes of log-probs, masks and advantages at the failing line (dumpdiff --inspect on a dump of the step).",
            "Pad policy and reference log-probs to the same length; build the mask from the same lengths.",
            "Check that batch size × group size matches the number of completions.",
        ],
    },
    Signature {
        id: "chat-template",
        title: "Chat template problem",
        needles: &[
            "chat_template",
            "chat template",
            "apply_chat_template",
        ],
        explanation: "The tokenizer's chat template is missing or wrong, so prompts are not formatted the way the model was trained on and completions come back blank or garbled.",
        fixes: &[
            "Use the model's own chat template (tokenizer.apply_chat_template with add_generation_prompt=True) in training and evaluation alike.",
            "Print one formatted prompt and the decoded completion before training.",
        ],
    },
];

/// The run-level "chat template garbage" verdict: completions blank from the first step on.
pub fn chat_template_garbage(detail: String) -> Classification {
    Classification {
        id: "chat-template",
        title: "Blank completions from the first step (chat template?)",
        explanation: format!(
            "Completions came back empty from the first logged step on and kept doing so ({detail}). A model that answers nothing from step one is usually being fed prompts in the wrong format: a missing or mismatched chat template, or a generation prompt that is not added."
        ),
        fixes: vec![
            "Format prompts with the model's own chat template (apply_chat_template, add_generation_prompt=True) and decode one sampled completion by hand.",
            "Compare the training prompt format with the one used in evaluation, where the model answers.",
            "Check the dataset's prompt/answer fields (pre-flight: empty prompts or answers).",
        ],
        matched: String::new(),
    }
}

/// Classify an exception from its `Type: message` text (all of a chain's lines).
pub fn classify(text: &str) -> Classification {
    let lower = text.to_lowercase();
    for s in SIGNATURES {
        if let Some(n) = s.needles.iter().find(|n| lower.contains(*n)) {
            let matched = text
                .lines()
                .find(|l| l.to_lowercase().contains(n))
                .unwrap_or_default()
                .trim()
                .to_string();
            return Classification {
                id: s.id,
                title: s.title,
                explanation: s.explanation.to_string(),
                fixes: s.fixes.to_vec(),
                matched,
            };
        }
    }
    Classification {
        id: "unknown",
        title: "Unrecognised exception",
        explanation: "No known crash signature matches this exception; it is shown as written. Start from the last frame of the trainer's own code.".to_string(),
        fixes: Vec::new(),
        matched: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_signature_is_recognised() {
        let cases = [
            ("ValueError: [logsumexp] Received empty array.", "empty-array"),
            ("FloatingPointError: Detected NaNs in gradients at step 41", "nan-gradient"),
            ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
            ("RuntimeError: [METAL] Command buffer execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)", "oom"),
            ("torch.distributed.DistBackendError: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE) ran for 600041 milliseconds", "collective-timeout"),
            ("RuntimeError: The size of tensor a (128) must match the size of tensor b (127) at non-singleton dimension 1", "shape-mismatch"),
            ("ValueError: [broadcast_shapes] Shapes (4,12) and (4,11) cannot be broadcast.", "shape-mismatch"),
            ("ValueError: Cannot use chat template functions because tokenizer.chat_template is not set", "chat-template"),
            ("KeyError: 'answer'", "unknown"),
        ];
        for (text, id) in cases {
            assert_eq!(classify(text).id, id, "{text}");
        }
    }

    #[test]
    fn matched_line_is_the_one_with_the_needle() {
        let c = classify("KeyError: 'x'\nRuntimeError: CUDA out of memory");
        assert_eq!(c.matched, "RuntimeError: CUDA out of memory");
    }
}
