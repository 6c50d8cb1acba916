#!/usr/bin/env python3
"""Plain python+torch baseline for `dumpdiff`: torch.load every file of a self-hosted and a
weaver dump tree once, compare the same tensors with the same metrics (mask-aware, rows
paired by index - the large tree has no reordering), print the wall time as JSON.

usage: dumpdiff_baseline.py SELF_HOSTED_DIR WEAVER_DIR STEP
"""
import glob, json, math, os, re, sys, time

import torch

def metrics(a, b, atol, rtol, logprob):
    a, b = a.double(), b.double()
    d = (a - b).abs()
    out = {"count": a.numel()}
    i = int(torch.argmax(torch.nan_to_num(d, nan=math.inf)))
    out["max_abs"] = (float(d.flatten()[i]), i, float(a.flatten()[i]), float(b.flatten()[i]))
    fin = torch.isfinite(a) & torch.isfinite(b)
    af, bf, df = a[fin], b[fin], d[fin]
    out["mean_abs"] = float(df.mean()) if df.numel() else 0.0
    nz = af != 0
    out["max_rel"] = float((df[nz] / af[nz].abs()).max()) if nz.any() else 0.0
    out["rmse"] = float((df * df).mean().sqrt()) if df.numel() else 0.0
    out["cosine"] = float(torch.nn.functional.cosine_similarity(af, bf, dim=0))
    out["pearson"] = float(torch.corrcoef(torch.stack([af, bf]))[0, 1]) if af.numel() > 1 else None
    out["nan"] = (int(a.isnan().sum()), int(b.isnan().sum()))
    out["inf"] = (int(a.isinf().sum()), int(b.isinf().sum()))
    beyond = ~torch.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
    out["beyond"] = int(beyond.sum())
    if logprob:
        out["k1"] = float((af - bf).mean())
        x = bf - af
        out["k3"] = float((x.exp() - x - 1).mean())
        pd = (af.exp() - bf.exp()).abs()
        out["max_prob_diff"], out["mean_prob_diff"] = float(pd.max()), float(pd.mean())
    return out

def ulp(a, b):
    if a.dtype != b.dtype or a.dtype not in (torch.float32,):
        return None
    ia, ib = a.contiguous().view(torch.int32).long(), b.contiguous().view(torch.int32).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int((ia - ib).abs().max())

def main():
    s_dir, w_dir, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = time.perf_counter()
    nbytes = 0
    def load(p):
        nonlocal nbytes
        nbytes += os.path.getsize(p)
        return torch.load(p, weights_only=True)
    old = load(f"{s_dir}/old_log_probs/step_{step:06d}.pt")["old_log_probs"]
    results = []
    pat = re.compile(r"rank(\d+)_micro(\d+)")
    for f in sorted(glob.glob(f"{s_dir}/forward_data/step_{step:06d}_rank*_micro*.pt")):
        r, m = map(int, pat.search(f).groups())
        name = os.path.basename(f)
        s, w = load(f), load(f"{w_dir}/forward_data/{name}")
        mask = s["response_mask"].bool() & w["response_mask"].bool()
        for key, lp in (("log_probs", True), ("entropy", False)):
            a, b = s[key], w[key]
            res = metrics(a[mask], b[mask], 1e-5, 1.6e-2, lp)
            res["ulp"] = ulp(a[mask], b[mask])
            results.append(("forward_data", r, m, key, res))
        results.append(("forward_data", r, m, "response_mask",
                        metrics(s["response_mask"], w["response_mask"], 0, 0, False)))
        isd = load(f"{w_dir}/is_loss_debug/{name}")
        rows = s["log_probs"].shape[0]
        nm = len(glob.glob(f"{s_dir}/forward_data/step_{step:06d}_rank{r}_micro*.pt"))
        base = (r * nm + m) * rows
        old_a = old[base:base + rows]
        vmask = s["response_mask"].bool() & isd["effective_valid"].bool()
        ratio = torch.exp(s["log_probs"].double() - old_a.double())
        for key, a, lp in (("log_probs", s["log_probs"], True), ("old_log_probs", old_a, True),
                           ("prob_ratio", ratio, False)):
            results.append(("is_loss", r, m, key, metrics(a[vmask], isd[key][vmask], 1e-5, 3.2e-2, lp)))
        sl, wl = load(f"{s_dir}/loss/{name}"), load(f"{w_dir}/loss/{name}")
        for key in ("loss", "pg_loss", "entropy_loss"):
            results.append(("loss", r, m, key, abs(sl[key] - wl[key])))
        for k in sl["metrics"]:
            if k in wl["metrics"]:
                results.append(("loss", r, m, "metrics." + k, abs(sl["metrics"][k] - wl["metrics"][k])))
        results.append(("is_loss", r, m, "loss", abs(sl["loss"] - float(isd["loss"]))))
    dt = time.perf_counter() - t0
    print(json.dumps({"seconds": dt, "bytes": nbytes, "comparisons": len(results),
                      "mb_per_s": nbytes / 1e6 / dt, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))

if __name__ == "__main__":
    main()
