"""Write one training step as NexRL's DataDumper lays it out, at a real step's size, for
the side-by-side benchmark (benches/real_step.sh). Nothing here is committed output.

    python3 benches/gen_real_step.py OUT_DIR [--ranks 12] [--micros 2] [--rows 64]
                                             [--length 4096] [--prompt 256]
                                             [--no-echo] [--dynamic-micros]

--no-echo: the loss files' extra_info holds only epoch and batch_idx (no entropy_coeff, no
  loss_agg_mode), as a trainer that does not echo its settings writes it: the consumer has
  to infer the coefficient and the aggregation from the dumped terms.
--dynamic-micros: each rank's micros * rows rows split into micros of different sizes (as
  dynamic batch sizing by token count does), each between rows / 2 and 3 * rows / 2; the
  rows are drawn as in the default layout (the same generator, in the same order).

OUT_DIR/self_hosted_pt (what `DataDumper` writes from the trainer and the FSDP actor):
  trajectory/step_000000.pt      {step, num_trajectories, trajectories: [{tokens: [int],
                                  loss_mask: [int], reward, is_val, extra_fields: {group_id,
                                  uid, run_id, task_id, score, temperature}}]} - token lists as
                                  Python lists (DataDumper's `_to_serializable` calls .tolist())
  old_log_probs/step_000000.pt   {step, old_log_probs: f32 [B, R], shape, batch_info}
  forward_data/step_000000_rank{r}_micro{m}.pt  {step, rank, micro_idx, log_probs f32 [mb, R],
                                  entropy bf16 [mb, R], response_mask i32 [mb, R],
                                  log_probs_shape, entropy_shape, input_ids i64 [mb, P + R]}
  loss/…_rank{r}_micro{m}.pt     {step, rank, micro_idx, loss, pg_loss, entropy_loss, metrics,
                                  extra_info: {epoch, batch_idx, entropy_coeff, …}}
  param/, gradient/ step_000000_rank{r}.pt
OUT_DIR/weaver_pt: forward_data (log-probs rounded through bf16, trimmed to the micro's
  longest response, input_ids in the datum layout tokens[:-1]), loss, is_loss_debug,
  batch_inputs, param, gradient - every one step_000000_rank{r}_micro{m}.pt.

B = ranks x micros x rows trajectories, rows split contiguously over ranks and micros;
response lengths uniform in [R/4, R], prompts in [P/8, P] left-padded; token ids drawn
log-uniformly from a 151,936 vocabulary (most ids small, as real text), never 0 (the pad).
The loss is NexRL's importance-sampling loss with a nonzero entropy coefficient:
loss = token-mean(-exp(logp - old) * A) - 0.001 * token-mean(entropy).
"""
import argparse
import os
import sys

import numpy as np
import torch

VOCAB = 151936
ENTROPY_COEFF = 0.001
CLIP_EPS = 0.2
GROUP = 8


def name(r=None, m=None):
    s = "step_000000"
    if r is not None:
        s += "_rank%d" % r
    if m is not None:
        s += "_micro%d" % m
    return s + ".pt"


def save(root, tree, kind, fname, data):
    d = os.path.join(root, tree, kind)
    os.makedirs(d, exist_ok=True)
    torch.save(data, os.path.join(d, fname))


def token_ids(rs, n):
    """Log-uniform ids in [1, VOCAB): a third below 256, one in fourteen above 65535."""
    return np.minimum(np.exp(rs.uniform(0.0, np.log(VOCAB), size=n)).astype(np.int64), VOCAB - 1)


def is_loss(logp, old, adv_rows, mask, ent):
    """NexRL importance-sampling loss of one micro, token-mean, with the entropy bonus."""
    m = mask.to(torch.float32)
    ratio = torch.exp(logp - old)
    A = adv_rows.view(-1, 1).expand_as(logp) * m
    elem = -ratio * A * m
    ntok = m.sum()
    pg = elem.sum() / ntok
    ent_mean = (ent.to(torch.float32) * m).sum() / ntok
    d = logp - old
    return {
        "ratio": ratio, "A": A, "elem": elem, "valid": m, "pg": pg, "ent": ent_mean,
        "loss": pg - ENTROPY_COEFF * ent_mean,
        "metrics": {
            "pg_loss": float(pg),
            "approx_kl": float((0.5 * d * d * m).sum() / ntok),
            "avg_ratio": float((ratio * m).sum() / ntok),
            "clip_frac": float((((ratio - 1.0).abs() > CLIP_EPS).float() * m).sum() / ntok),
            "entropy": float(ent_mean),
            "num_tokens": int(ntok.item()),
        },
    }


def loss_file(r, m, L, echo=True):
    extra = {"epoch": 0, "batch_idx": m}
    if echo:
        extra.update({"entropy_coeff": ENTROPY_COEFF, "loss_agg_mode": "token-mean"})
    return {
        "step": 0, "rank": r, "micro_idx": m, "loss": float(L["loss"]), "pg_loss": float(L["pg"]),
        "entropy_loss": float(L["ent"]), "metrics": dict(L["metrics"]), "extra_info": extra,
    }


def micro_sizes(ranks, micros, rows, dynamic):
    """Rows of each (rank, micro): `rows` each, or each rank's micros * rows split unevenly
    (a generator of its own, so the default layout's draws are untouched)."""
    if not dynamic or micros == 1:
        return [[rows] * micros for _ in range(ranks)]
    rs = np.random.RandomState(7)
    out = []
    for _ in range(ranks):
        while True:
            s = rs.randint(max(rows // 2, 1), 3 * rows // 2 + 1, size=micros - 1).tolist()
            last = micros * rows - sum(s)
            if max(rows // 2, 1) <= last <= 3 * rows // 2:
                out.append(s + [last])
                break
    return out


def param_file(r, which, t, m=None):
    f = t.float()
    d = {"step": 0, "rank": r, "param_name": "model.layers.0.self_attn.q_proj.weight",
         which: t.clone(), "shape": list(t.shape), "dtype": str(t.dtype),
         "norm": float(f.norm()), "mean": float(f.mean()), "std": float(f.std())}
    if m is not None:
        d["micro_idx"] = m
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=12)
    ap.add_argument("--micros", type=int, default=2)
    ap.add_argument("--rows", type=int, default=64, help="rows per micro-batch")
    ap.add_argument("--length", type=int, default=4096, help="longest response R")
    ap.add_argument("--prompt", type=int, default=256, help="longest prompt P")
    ap.add_argument("--no-echo", action="store_true", help="no coefficients in extra_info")
    ap.add_argument("--dynamic-micros", action="store_true", help="micros of different sizes")
    a = ap.parse_args()
    sizes = micro_sizes(a.ranks, a.micros, a.rows, a.dynamic_micros)
    echo = not a.no_echo
    R, P = a.length, a.prompt
    B = a.ranks * a.micros * a.rows
    rs = np.random.RandomState(20251123)
    rewards = rs.randint(0, 2, size=B).astype(np.float64)
    groups = np.arange(B) // GROUP
    adv = np.zeros(B)
    for g in range(groups.max() + 1):
        r = rewards[groups == g]
        adv[groups == g] = (r - r.mean()) / (r.std(ddof=1) + 1e-4)  # TRL / nexrl-is preset
    adv32 = torch.from_numpy(adv.astype(np.float32))
    param = torch.from_numpy(rs.normal(0, 0.02, size=(256, 256)).astype(np.float32)).to(torch.bfloat16)
    grad = torch.from_numpy(rs.normal(0, 1e-4, size=(256, 256)).astype(np.float32)).to(torch.bfloat16)
    olds = []
    trajectories = []
    for r in range(a.ranks):
        for m in range(a.micros):
            base = r * a.micros * a.rows + sum(sizes[r][:m])
            mb = sizes[r][m]
            resp = rs.randint(R // 4, R + 1, size=mb)
            prompt = rs.randint(max(P // 8, 1), P + 1, size=mb)
            mask = (np.arange(R)[None, :] < resp[:, None]).astype(np.int32)
            ids = np.zeros((mb, P + R), dtype=np.int64)
            toks = []
            for i in range(mb):
                t = token_ids(rs, prompt[i] + resp[i])
                toks.append(t)
                ids[i, P - prompt[i]:P + resp[i]] = t
            old = (-rs.gamma(0.6, 1.5, size=(mb, R)) * mask).astype(np.float32)
            new = ((old + rs.normal(0, 0.05, size=(mb, R))) * mask).astype(np.float32)
            ent = torch.from_numpy((rs.uniform(0.05, 3.0, size=(mb, R)) * mask).astype(np.float32)).to(torch.bfloat16)
            olds.append(old)
            for i in range(mb):
                b = base + i
                trajectories.append({
                    "tokens": toks[i].tolist(),
                    "loss_mask": [0] * int(prompt[i]) + [1] * int(resp[i]),
                    "reward": float(rewards[b]),
                    "is_val": False,
                    "extra_fields": {"group_id": "group-%05d" % groups[b], "uid": "%032x" % groups[b],
                                     "run_id": int(b % GROUP), "task_id": int(groups[b]),
                                     "score": float(rewards[b]), "temperature": 1.0},
                })
            new_t, old_t, mask_t = torch.from_numpy(new), torch.from_numpy(old), torch.from_numpy(mask)
            A_rows = adv32[base:base + mb]
            L = is_loss(new_t, old_t, A_rows, mask_t, ent)
            save(a.out, "self_hosted_pt", "forward_data", name(r, m), {
                "step": 0, "rank": r, "micro_idx": m, "log_probs": new_t, "entropy": ent,
                "response_mask": mask_t, "log_probs_shape": [mb, R], "entropy_shape": [mb, R],
                "input_ids": torch.from_numpy(ids)})
            save(a.out, "self_hosted_pt", "loss", name(r, m), loss_file(r, m, L, echo))
            # Weaver: bf16-rounded log-probs, tensors trimmed to the micro's longest response,
            # input_ids in the datum layout (tokens[:-1], right-padded).
            Rm = int(resp.max())
            T = int((prompt + resp).max()) - 1
            wnew = new_t.to(torch.bfloat16).to(torch.float32)[:, :Rm].contiguous()
            wold, wmask, went = old_t[:, :Rm].contiguous(), mask_t[:, :Rm].contiguous(), ent[:, :Rm].contiguous()
            WL = is_loss(wnew, wold, A_rows, wmask, went)
            dids = np.zeros((mb, T), dtype=np.int64)
            tgt = np.zeros((mb, T), dtype=np.int64)
            lmask = np.zeros((mb, T), dtype=np.float32)
            for i in range(mb):
                n = len(toks[i]) - 1
                dids[i, :n] = toks[i][:-1]
                tgt[i, :n] = toks[i][1:]
                lmask[i, prompt[i] - 1:n] = 1.0
            save(a.out, "weaver_pt", "forward_data", name(r, m), {
                "step": 0, "rank": r, "micro_idx": m, "log_probs": wnew, "entropy": went,
                "response_mask": wmask, "log_probs_shape": [mb, Rm], "entropy_shape": [mb, Rm],
                "input_ids": torch.from_numpy(dids),
                "extra_info": {"micro_batch_size": mb, "input_layout": "datum"}})
            save(a.out, "weaver_pt", "loss", name(r, m), loss_file(r, m, WL, echo))
            save(a.out, "weaver_pt", "is_loss_debug", name(r, m), {
                "step": 0, "rank": r, "micro_idx": m, "log_probs": wnew, "old_log_probs": wold,
                "advantages": WL["A"], "prob_ratio": WL["ratio"], "elementwise_loss": WL["elem"],
                "effective_valid": WL["valid"], "loss": WL["loss"].reshape(())})
            pos = np.broadcast_to(np.arange(T, dtype=np.int64), (mb, T)).copy()
            save(a.out, "weaver_pt", "batch_inputs", name(r, m), {
                "step": 0, "rank": r, "micro_idx": m, "input_ids": torch.from_numpy(dids),
                "target_tokens": torch.from_numpy(tgt), "position_ids": torch.from_numpy(pos),
                "attention_mask": torch.from_numpy(dids != 0), "loss_mask": torch.from_numpy(lmask),
                "rewards": torch.from_numpy(rewards[base:base + mb].copy()),
                "sample_weights": torch.ones(mb, dtype=torch.float16),
                "is_truncated": torch.from_numpy((resp == R).astype(np.uint8))})
            save(a.out, "weaver_pt", "param", name(r, m), param_file(r, "param", param, m))
            save(a.out, "weaver_pt", "gradient", name(r, m), param_file(r, "gradient", grad, m))
        save(a.out, "self_hosted_pt", "param", name(r), param_file(r, "param", param))
        save(a.out, "self_hosted_pt", "gradient", name(r), param_file(r, "gradient", grad))
        print("rank %d/%d" % (r + 1, a.ranks), file=sys.stderr)
    whole = torch.from_numpy(np.concatenate(olds, axis=0))
    save(a.out, "self_hosted_pt", "old_log_probs", name(), {
        "step": 0, "old_log_probs": whole, "shape": list(whole.shape),
        "batch_info": {"batch_size": B, "input_ids_shape": [B, P + R]}})
    save(a.out, "self_hosted_pt", "trajectory", name(), {
        "step": 0, "num_trajectories": B, "trajectories": trajectories})
    print("wrote %s: %d ranks x %d micros x %d rows x %d tokens%s%s" % (
        a.out, a.ranks, a.micros, a.rows, R, "" if echo else ", coefficients not echoed",
        ", micro sizes %s" % sizes if a.dynamic_micros else ""))


if __name__ == "__main__":
    main()
