#!/usr/bin/env python3
"""Score dumpdiff and losscheck JSON reports against the scenarios' truth.json.

    python3 benches/score_scenarios.py DIR [DIR...] [--json OUT]

Each DIR is one scenario written by fixtures/gen/make_scenarios.py, holding `truth.json`
and, under `out/`, the reports benches/scenarios.sh wrote: `dumpdiff.json`,
`losscheck_self_hosted_pt.json`, `losscheck_weaver_pt.json` and `*.rc` (exit codes).

Counted per seed and in total:
- dumpdiff cells: a (section, rank, micro) cell whose verdict is fail or warn is a flag; a
  flag no injected fault explains is a false alarm (fa), a required truth cell not flagged a
  miss. A changed coefficient must be reported as a `coefficients` entry `{name, differ:
  true}` naming it (`entropy_coeff/kl_coef` when one cell cannot tell them apart): one miss
  otherwise (unless truth says `required: false`: no cell has its loss file on both
  sides); the cells it changes may be flagged. A differing coefficient reported where
  truth has none is a false alarm (coef_fa, counted with fa).
- dumpdiff positions (pos): for a fault with positions, the named tensor's first value
  beyond tolerance in that cell must be one of the fault's (row, pos); pos counts faults
  where it is not (or the tensor passed).
- coverage: a file on one side only, as truth lists it, must be in the report's coverage;
  extra coverage entries are false alarms.
- losscheck: the files called inconsistent, against truth's inconsistent files; a truly
  inconsistent file called undetermined is a miss; lc_undet counts the undetermined ones
  (a cell whose total holds terms no file states the coefficients of: a warning, neither
  a false alarm nor a miss, and not counted against "fully clean").
- rc: the exit code must be 1 when truth expects a finding (dumpdiff: a required cell or a
  coefficient; files on one side only are warnings, exit 0 at its default --fail-on error;
  cells that may be flagged allow 0 or 1), 0 when it expects none; an exit code of 2 (could
  not read) counts as one error.

The real-producer family (truth `family: real`, fixtures/gen/make_real_scenarios.py) adds:
- cannot judge (cj_fail / cj_silent): a cell or file truth calls "cannot judge" (a
  convention withheld from the data) must be reported as a warning (a dumpdiff cell
  verdict warn / a text saying "cannot judge"; a losscheck status `undetermined` or
  "cannot judge"), never `fail` / `inconsistent` (cj_fail) nor silently passed
  (cj_silent); such cells are not false alarms.
- causes (cause_miss): every fault whose required cell is flagged must be named in the
  words truth gives (`CAUSE_WORDS` below) in what its flagged cells say (reason, the
  flagged comparisons' names, reasons and diagnoses) or the adjudication of that cell; cells truth
  says may differ by a convention (TIS on one side) must name "importance weight" when
  flagged.
- unreadable (unread_miss): a truncated file: both tools must exit 2 WITH a report, the
  report must name the file, and every other cell must be judged; the truncated cell's
  verdicts are not scored. An exit code of 2 then is not an error.
- rc: the exit code truth gives (`dumpdiff.exit_code`, `losscheck.<tree>.exit_code`;
  0 or 1 where cells may be flagged).
- cov_fa: a file dumpdiff reports on one side only (the family writes every file on both).
- disagree: a side dumpdiff's adjudication calls inconsistent (or not) where losscheck
  says the opposite of that side's file (the issue: both tools agree on which side is
  wrong).

With `--novel` (fixtures/gen/real_novel.py) truth may also hold: `dumpdiff.
cannot_judge_optional_cells` and `losscheck.<tree>.cannot_judge_optional` (a withheld term,
e.g. the self-hosted KL loss, moves that one cell or file by 1/3-3x the rounding bound: any
verdict), a `kl_coef` coefficient entry (not required: naming `entropy_coeff` alone is a
false alarm), and flag cells whose sides differ by construction (`agg_nexrl_vs_verl`,
`self_hosted_ratio_one`, as `tis_weaver_only`): may be flagged, and when flagged the cause
truth gives must be named.

Exit status: 0 when every count is zero, 1 otherwise.
"""

import json
import os
import re
import sys

FLAG_VERDICTS = {"fail", "warn"}


def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def rc_of(path):
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def score_dumpdiff(truth, rep):
    allowed = {(c["section"], c["rank"], c["micro"]) for c in truth["dumpdiff"]["flag_cells"]}
    exp = {(c["section"], c["rank"], c["micro"]) for c in truth["dumpdiff"]["flag_cells"] if c["required"]}
    got, cells = set(), {}
    for sec in rep.get("sections", []):
        for c in sec.get("cells", []):
            key = (sec["name"], c.get("rank"), c.get("micro"))
            cells[key] = c
            if c.get("verdict") in FLAG_VERDICTS:
                got.add(key)
    fa = sorted(got - allowed, key=str)
    miss = sorted(exp - got, key=str)
    pos_err = []
    for f in truth["faults"]:
        if not f.get("positions"):
            continue
        want = {(p["row"], p["other_row"], p["pos"]) for p in f["positions"]}
        for dc in f["dumpdiff_cells"]:
            if dc["section"] != "is_loss" or not dc.get("required", True):
                continue
            c = cells.get((dc["section"], dc["rank"], dc["micro"]))
            cmp_ = None
            for x in (c or {}).get("comparisons", []):
                if x.get("name") == dc["tensor"]:
                    cmp_ = x
            fb = ((cmp_ or {}).get("metrics") or {}).get("first_beyond")
            if not fb or cmp_.get("verdict") not in FLAG_VERDICTS or \
                    (fb.get("row"), fb.get("other_row"), fb.get("pos")) not in want:
                pos_err.append("%s r%s m%s %s" % (f["kind"], dc["rank"], dc["micro"], dc["tensor"]))
    # a coefficient that differs between the sides: a `coefficients` entry of the report
    # naming it with both values, or (today's reports have no such field) a flagged loss cell
    coef_miss = []
    for want in [w for w in truth["dumpdiff"].get("coefficients", []) if w.get("required", True)]:
        # named alone, or with the other coefficient when one cell cannot tell them apart
        # (`entropy_coeff/kl_coef`)
        named = any(want["name"] in c.get("name", "").split("/") and c.get("differ")
                    for c in rep.get("coefficients", []))
        if not named:
            coef_miss.append(want["name"])
    wanted = {w["name"] for w in truth["dumpdiff"].get("coefficients", [])}
    coef_fa = [c["name"] for c in rep.get("coefficients", [])
               if c.get("differ") and not wanted & set(c.get("name", "").split("/"))]
    exp_cov = {(c["kind"], c["rank"], c["micro"], c["missing_on"]) for c in truth["dumpdiff"]["coverage"]}
    got_cov = set()
    for c in rep.get("coverage", []):
        key = (c["kind"], c["rank"], c["micro"], c["missing_on"])
        # self-hosted param/gradient files are per rank: a weaver rank-level report (micro
        # null) stands for the weaver's missing per-micro file of that rank
        if c["micro"] is None and c["kind"] in ("param", "gradient"):
            key = next((e for e in exp_cov if e[:2] == key[:2] and e[3] == key[3]), key)
        got_cov.add(key)
    return {"fa": fa + ["coefficient " + n for n in coef_fa], "miss": miss + ["coefficient " + n for n in coef_miss], "pos": pos_err,
            "cov_fa": sorted(got_cov - exp_cov, key=str), "cov_miss": sorted(exp_cov - got_cov, key=str)}


def score_losscheck(truth, tree, rep):
    exp = set(truth["losscheck"][tree]["inconsistent"])
    got, undet = set(), set()
    for v in rep.get("verdicts", []):
        p = v.get("file", "").split(tree + "/", 1)[-1]
        if v.get("status") == "inconsistent":
            got.add(p)
        elif v.get("status") == "undetermined":
            undet.add(p)
    return {"fa": sorted(got - exp), "miss": sorted(exp - got), "undet": sorted(undet - exp)}


# --------------------------------------------------------------------------
# The real-producer family
# --------------------------------------------------------------------------

# keywords a diagnosis must contain for each cause truth names (the same table as
# fixtures/gen/make_real_scenarios.py CAUSES, keyed by the cause)
CAUSE_WORDS = {
    "temperature": ["temperature"],
    "clip bound": ["clip bound", "clip_ratio", "clip_high", "clip-high", "clip higher", "clip ratio"],
    "ratio level": ["sequence ratio", "ratio level", "gspo", "token ratio", "token-level"],
    "old_log_probs": ["old_log_probs", "shift"],
    "mask": ["mask"],
    "advantages": ["advantage"],
    "aggregation": ["aggregation", "loss_agg_mode", "summed"],
    "coefficient": ["entropy_coeff", "coefficient"],
    "importance weight": ["importance", "rollout", "tis"],
    "rejection sampling": ["reject", "rollout_rs"],
}


def text_of(x):
    """Every string in a JSON value, lower-cased and joined (to search a cause in)."""
    out = []

    def walk(v):
        if isinstance(v, str):
            out.append(v.lower())
        elif isinstance(v, dict):
            for k, w in v.items():
                out.append(str(k).lower())
                walk(w)
        elif isinstance(v, list):
            for w in v:
                walk(w)
    walk(x)
    return " ".join(out)


def cell_text(c):
    """What a flagged cell says: its reason, the names, reasons and any diagnosis / cause of
    its flagged comparisons, and any diagnosis / cause of the cell (not the names of the
    comparisons that pass, nor tolerance sources)."""
    if not c:
        return ""
    parts = [c.get("reason", "")]
    for k, v in c.items():
        if "diagnos" in k or "cause" in k:
            parts.append(text_of(v))
    for x in c.get("comparisons", []) or []:
        if x.get("verdict") in FLAG_VERDICTS:
            parts += [x.get("name", ""), x.get("reason", "")]
            parts += [text_of(v) for k, v in x.items() if "diagnos" in k or "cause" in k]
    return " ".join(parts).lower()


def names_cause(text, cause):
    """A cause word at the start of a word (`mask`, not `response_mask`); the tolerance
    text's "clip boundary" names no clip bound."""
    text = text.replace("clip boundary", "")
    return any(re.search(r"(?<![a-z_])" + re.escape(w), text) for w in CAUSE_WORDS.get(cause, [cause]))


def says_cannot_judge(text):
    return any(w in text for w in ("cannot judge", "cannot-judge", "cannot_judge", "undetermined", "cannot be judged"))


def score_dumpdiff_real(truth, rep, rc):
    dt = truth["dumpdiff"]
    unread = {(u["rank"], u["micro"]) for u in dt.get("unreadable", [])}
    cj = {(c["section"], c["rank"], c["micro"]) for c in dt.get("cannot_judge", [])}
    # too close to call (truth's cannot_judge_optional): any verdict
    opt = {(sec, o["rank"], o["micro"]) for o in dt.get("cannot_judge_optional", []) for sec in ("is_loss", "loss")}
    # (--novel) single cells a withheld term moves by 1/3-3x the rounding bound
    opt |= {(o["section"], o["rank"], o["micro"]) for o in dt.get("cannot_judge_optional_cells", [])}
    allowed = {(c["section"], c["rank"], c["micro"]) for c in dt["flag_cells"]}
    exp = {(c["section"], c["rank"], c["micro"]) for c in dt["flag_cells"] if c["required"]}
    cells, got = {}, set()
    for sec in rep.get("sections", []):
        for c in sec.get("cells", []):
            key = (sec["name"], c.get("rank"), c.get("micro"))
            cells[key] = c
            if c.get("verdict") in FLAG_VERDICTS:
                got.add(key)
    adj = {}
    for a in rep.get("adjudication", []) or []:
        adj.setdefault((a.get("rank"), a.get("micro")), []).append(a)
    # the report's diagnosis lines name their cell ("rank R micro M: ..."): they count as
    # said of that cell
    for line in rep.get("diagnosis", []) or []:
        m = re.match(r"rank (\d+) micro (\d+):", line)
        if m:
            adj.setdefault((int(m.group(1)), int(m.group(2))), []).append(line)
    res = {"fa": [], "miss": [], "cj_fail": [], "cj_silent": [], "cause_miss": [], "unread_miss": [],
           "not_judged": [], "named": []}
    for key in sorted(got - allowed - cj - opt, key=str):
        if (key[1], key[2]) not in unread:
            res["fa"].append(list(key))
    for key in sorted(exp - got, key=str):
        if (key[1], key[2]) not in unread:
            res["miss"].append(list(key))
    for key in sorted(cj, key=str):
        c = cells.get(key)
        t = text_of(c) if c else ""
        if c and c.get("verdict") == "fail" and not says_cannot_judge(t):
            res["cj_fail"].append(list(key))
        elif not c or (c.get("verdict") == "pass" and not says_cannot_judge(t)):
            res["cj_silent"].append(list(key))
    # causes: a fault with a flagged required cell is named in one of its flagged cells
    for f in truth["faults"]:
        if f["kind"] == "coeff_changed":
            continue  # named by the `coefficients` finding (scored as a miss otherwise)
        flagged = [(cc["section"], cc["rank"], cc["micro"]) for cc in f["dumpdiff_cells"]
                   if (cc["section"], cc["rank"], cc["micro"]) in got]
        if not flagged:
            continue
        t = " ".join(cell_text(cells[k]) for k in flagged) + " " + text_of(adj.get((f["rank"], f["micro"]), []))
        if not names_cause(t, f["cause"]):
            res["cause_miss"].append("%s r%d m%d (%s)" % (f["kind"], f["rank"], f["micro"], f["cause"]))
        else:
            res["named"].append("%s r%d m%d" % (f["kind"], f["rank"], f["micro"]))
    # cells whose sides differ by construction (a convention one side has: TIS on the weaver,
    # and with --novel NexRL's vs verl's seq-mean-token-sum, a self-hosted ratio of one):
    # when flagged, the cause truth gives must be named
    fault_kinds = {f["kind"] for f in truth["faults"]}
    for c in dt["flag_cells"]:
        key = (c["section"], c["rank"], c["micro"])
        if key not in got:
            continue
        t = cell_text(cells[key]) + " " + text_of(adj.get((c["rank"], c["micro"]), []))
        for kind, cause in zip(c["faults"], c["causes"]):
            if kind not in fault_kinds and not names_cause(t, cause):
                res["cause_miss"].append("%s %s r%d m%d (%s)" % ((kind,) + key + (cause,)))
    if dt.get("unreadable"):
        t = text_of(rep)
        for u in dt["unreadable"]:
            if not rep or u["file"].lower() not in t:
                res["unread_miss"].append(u["tree"] + "/" + u["file"])
        # every other cell of the loss section must still be judged
        for c in truth["cells"]:
            if (c["rank"], c["micro"]) not in unread and ("loss", c["rank"], c["micro"]) not in cells:
                res["not_judged"].append(["loss", c["rank"], c["micro"]])
    # coefficients: as in the old family
    base = score_dumpdiff({"dumpdiff": {"flag_cells": [], "coefficients": dt["coefficients"], "coverage": []},
                           "faults": []}, rep)
    res["miss"] += [m for m in base["miss"] if isinstance(m, str)]
    res["fa"] += [m for m in base["fa"] if isinstance(m, str)]
    # cells that may be flagged (a changed coefficient's, TIS on one side) allow exit 1 too
    may = dt["exit_code"] == 0 and bool(dt["flag_cells"] or dt.get("cannot_judge_optional"))
    res["rc_wrong"] = rc not in ((0, 1) if may else (dt["exit_code"],))
    # the family writes every file on both sides: any file reported on one side only is a
    # false alarm (e.g. a rank's micro that only another rank has)
    exp_cov = {(c["kind"], c["rank"], c["micro"], c["missing_on"]) for c in dt.get("coverage", [])}
    res["cov_fa"] = sorted({(c.get("kind"), c.get("rank"), c.get("micro"), c.get("missing_on"))
                            for c in rep.get("coverage", []) or []} - exp_cov, key=str)
    res["pos"], res["cov_miss"] = [], []
    return res


def score_losscheck_real(truth, tree, rep, rc):
    t = truth["losscheck"][tree]
    exp, cj = set(t["inconsistent"]), set(t.get("cannot_judge", []))
    # files the withheld weights move within a few roundings (older truth: dumpdiff's cells)
    opt = set(t["cannot_judge_optional"]) if "cannot_judge_optional" in t else {
        "is_loss_debug/step_%06d_rank%d_micro%d.pt" % (truth["step"], o["rank"], o["micro"])
        for o in truth["dumpdiff"].get("cannot_judge_optional", [])} if tree == "weaver_pt" else set()
    unread = set(t.get("unreadable", []))
    got, undet, status = set(), set(), {}
    for v in rep.get("verdicts", []):
        p = v.get("file", "").split(tree + "/", 1)[-1]
        status[p] = v
        if v.get("status") == "inconsistent":
            got.add(p)
        elif v.get("status") == "undetermined":
            undet.add(p)
    res = {"fa": sorted(got - exp - cj - unread - opt), "miss": sorted(exp - got), "undet": sorted(undet - exp - cj - opt),
           "cj_fail": [], "cj_silent": [], "unread_miss": []}
    for p in sorted(cj):
        v = status.get(p)
        if v and v.get("status") == "inconsistent" and not says_cannot_judge(text_of(v)):
            res["cj_fail"].append(p)
        elif not v or (v.get("status") not in ("undetermined", "cannot-judge") and not says_cannot_judge(text_of(v))):
            res["cj_silent"].append(p)
    txt = text_of(rep)
    for p in sorted(unread):
        if not rep or p.lower() not in txt:
            res["unread_miss"].append(p)
    # a file too close to call (optional) may be called inconsistent: exit 1 is allowed then
    may = t["exit_code"] == 0 and bool(got & opt)
    res["rc_wrong"] = rc not in ((0, 1) if may else (t["exit_code"],))
    return res


def score_real(d, truth):
    out = os.path.join(d, "out")
    res = {"seed": truth["seed"], "family": "real", "errors": []}
    rep = load(os.path.join(out, "dumpdiff.json"))
    rc = rc_of(os.path.join(out, "dumpdiff.rc"))
    if rep is None:
        res["errors"].append("dumpdiff rc=%s, no report" % rc)
        rep = {}
    res["dumpdiff"] = score_dumpdiff_real(truth, rep, rc)
    res["losscheck"] = {}
    for tree in ("self_hosted_pt", "weaver_pt"):
        rep = load(os.path.join(out, "losscheck_%s.json" % tree))
        rc = rc_of(os.path.join(out, "losscheck_%s.rc" % tree))
        if rep is None:
            res["errors"].append("losscheck %s rc=%s, no report" % (tree, rc))
            rep = {}
        res["losscheck"][tree] = score_losscheck_real(truth, tree, rep, rc)
        res.setdefault("_lc", {})[tree] = rep
    # dumpdiff's adjudication and losscheck must agree on which side is wrong: per
    # adjudicated cell and side, the status dumpdiff gives vs losscheck's for that file
    res["disagree"] = []
    dd = load(os.path.join(out, "dumpdiff.json")) or {}
    files = {"self-hosted": ("self_hosted_pt", "loss/"), "weaver": ("weaver_pt", "is_loss_debug/")}
    for a in dd.get("adjudication", []) or []:
        for side in a.get("sides", []):
            if side.get("role") not in files:
                continue
            tree, kind = files[side["role"]]
            name = "%sstep_%06d_rank%d_micro%d.pt" % (kind, truth["step"], a["rank"], a["micro"])
            lc = {v.get("file", "").split(tree + "/", 1)[-1]: v.get("status")
                  for v in res["_lc"][tree].get("verdicts", [])}
            if name in lc and (lc[name] == "inconsistent") != (side.get("status") == "inconsistent"):
                res["disagree"].append("%s %s: dumpdiff %s, losscheck %s" % (side["role"], name, side.get("status"),
                                                                              lc[name]))
    del res["_lc"]
    return res


def score(d):
    truth = load(os.path.join(d, "truth.json"))
    if truth.get("family") == "real":
        return score_real(d, truth)
    out = os.path.join(d, "out")
    res = {"seed": truth["seed"], "errors": []}
    # exit 1 when a required cell or a coefficient must be flagged; a cell that may be
    # flagged allows either; files on one side only are warnings (exit 0 at dumpdiff's
    # default --fail-on error)
    dd_truth = truth["dumpdiff"]
    coefs = dd_truth.get("coefficients", [])
    need = any(c["required"] for c in dd_truth["flag_cells"]) or any(c.get("required", True) for c in coefs)
    may = need or bool(dd_truth["flag_cells"]) or bool(coefs)
    rep = load(os.path.join(out, "dumpdiff.json"))
    rc = rc_of(os.path.join(out, "dumpdiff.rc"))
    if rep is None or rc == 2:
        res["errors"].append("dumpdiff rc=%s" % rc)
        rep = {}
    res["dumpdiff"] = score_dumpdiff(truth, rep)
    res["dumpdiff"]["rc_wrong"] = rc not in (None, 2) and not (rc == 1 if need else (rc in (0, 1) if may else rc == 0))
    res["losscheck"] = {}
    for tree in ("self_hosted_pt", "weaver_pt"):
        rep = load(os.path.join(out, "losscheck_%s.json" % tree))
        rc = rc_of(os.path.join(out, "losscheck_%s.rc" % tree))
        if rep is None or rc == 2:
            res["errors"].append("losscheck %s rc=%s" % (tree, rc))
            rep = {}
        s = score_losscheck(truth, tree, rep)
        s["rc_wrong"] = rc not in (None, 2) and rc != (1 if truth["losscheck"][tree]["inconsistent"] else 0)
        res["losscheck"][tree] = s
    return res


def counts(r):
    dd, lc = r["dumpdiff"], r["losscheck"]
    return {
        "dd_fa": len(dd["fa"]), "dd_miss": len(dd["miss"]), "dd_pos": len(dd["pos"]),
        "cov_fa": len(dd["cov_fa"]), "cov_miss": len(dd["cov_miss"]),
        "lc_fa": sum(len(v["fa"]) for v in lc.values()), "lc_miss": sum(len(v["miss"]) for v in lc.values()),
        "rc_wrong": int(dd["rc_wrong"]) + sum(int(v["rc_wrong"]) for v in lc.values()),
        "dd_rc": int(dd["rc_wrong"]),
        "errors": len(r["errors"]),
        "lc_undet": sum(len(v.get("undet", [])) for v in lc.values()),
        "cj_fail": len(dd.get("cj_fail", [])) + sum(len(v.get("cj_fail", [])) for v in lc.values()),
        "cj_silent": len(dd.get("cj_silent", [])) + sum(len(v.get("cj_silent", [])) for v in lc.values()),
        "cause_miss": len(dd.get("cause_miss", [])),
        "unread_miss": len(dd.get("unread_miss", [])) + len(dd.get("not_judged", []))
        + sum(len(v.get("unread_miss", [])) for v in lc.values()),
        "disagree": len(r.get("disagree", [])),
    }


def breakdown(dirs, results):
    """Per fault kind: how many were injected and caught in every required cell; per
    convention value: the mean false alarms per scenario (which convention hurts)."""
    truths = {r["seed"]: load(os.path.join(d, "truth.json")) for d, r in zip(dirs, results)}
    if any(r.get("family") == "real" for r in results):
        return breakdown_real(truths, results)
    kinds = {}
    for r in results:
        t = truths[r["seed"]]
        missed = {tuple(m) for m in r["dumpdiff"]["miss"] if isinstance(m, list)}
        pos = " ".join(r["dumpdiff"]["pos"])
        for f in t["faults"]:
            k = kinds.setdefault(f["kind"], [0, 0, 0])
            k[0] += 1
            cells = [(c["section"], c["rank"], c["micro"]) for c in f["dumpdiff_cells"] if c["required"]]
            if f["kind"] == "coeff_changed":
                k[1] += not any(str(m).startswith("coefficient") for m in r["dumpdiff"]["miss"])
            else:
                k[1] += all(c not in missed for c in cells)
            k[2] += f["kind"] not in pos or "r%s m%s" % (f.get("rank"), f.get("micro")) not in pos
    print("fault kind        injected  cells caught  position right")
    for k in sorted(kinds):
        print("%-17s %8d %13d %15d" % (k, *kinds[k]))
    keys = ["entropy_coeff", "kl_coef", "loss_agg_mode", "adv_eps", "coeffs_dumped", "self_hosted_entropy_dtype",
            "weaver_entropy_dtype", "weaver_log_probs", "weaver_log_probs_dtype", "weaver_padding", "weaver_input_ids_in",
            "self_hosted_old_log_probs", "remote_api"]
    print("convention = value: scenarios, mean dumpdiff false alarms, mean losscheck false alarms")
    for key in keys:
        groups = {}
        for r in results:
            v = truths[r["seed"]]["conventions"][key]
            groups.setdefault(str(v), []).append(r["counts"])
        parts = ["%s: %d, %.2f, %.2f" % (v, len(g), sum(c["dd_fa"] for c in g) / len(g),
                                         sum(c["lc_fa"] for c in g) / len(g)) for v, g in sorted(groups.items())]
        print("  %s = %s" % (key, " | ".join(parts)))


def breakdown_real(truths, results):
    """Real family: per fault kind, injected / required cells caught / cause named; per
    convention value: scenarios, mean dumpdiff and losscheck false alarms, fully clean."""
    kinds = {}
    for r in results:
        t = truths[r["seed"]]
        missed = {tuple(m) for m in r["dumpdiff"]["miss"] if isinstance(m, list)}
        named = set(r["dumpdiff"]["named"])
        for f in t["faults"]:
            k = kinds.setdefault(f["kind"], [0, 0, 0])
            k[0] += 1
            if f["kind"] == "coeff_changed":
                ok = not any(str(m).startswith("coefficient") for m in r["dumpdiff"]["miss"])
                k[1] += ok
                k[2] += ok
                continue
            cells = [(c["section"], c["rank"], c["micro"]) for c in f["dumpdiff_cells"] if c["required"]]
            k[1] += all(c not in missed for c in cells)
            k[2] += "%s r%d m%d" % (f["kind"], f["rank"], f["micro"]) in named
    print("fault kind        injected  cells caught  cause named")
    for k in sorted(kinds):
        print("%-17s %8d %13d %12d" % (k, *kinds[k]))
    keys = ["trajectory_order", "task_id", "dynamic_bsz", "coeffs_echoed", "pad_id", "padding_side",
            "self_hosted_input_ids", "weaver_attention_mask", "self_hosted_log_probs_dtype",
            "weaver_log_probs_dtype", "entropy_dtype", "temperature", "off_policy", "policy_loss", "clip_ratio_high",
            "loss_agg_mode", "entropy_coeff", "tis", "rollout_log_probs_dumped", "weaver_loss_scaled",
            # --novel (fixtures/gen/real_novel.py)
            "loss_func", "use_kl_loss", "kl_loss_type", "run_id_pattern", "rollout_is", "tis_cap",
            "agg_nexrl_vs_verl", "do_old_log_prob_compute", "self_hosted_format", "group_size"]
    print("convention = value: scenarios, mean dumpdiff false alarms, mean losscheck false alarms, fully clean")
    for key in keys:
        groups = {}
        for r in results:
            v = truths[r["seed"]]["conventions"].get(key)
            groups.setdefault(str(v), []).append(r["counts"])
        parts = ["%s: %d, %.2f, %.2f, %d" % (v, len(g), sum(c["dd_fa"] for c in g) / len(g),
                                             sum(c["lc_fa"] for c in g) / len(g),
                                             sum(all(x == 0 for k, x in c.items() if k != "lc_undet") for c in g))
                 for v, g in sorted(groups.items())]
        print("  %s = %s" % (key, " | ".join(parts)))


def main(argv):
    dirs, out_json = [], None
    it = iter(argv)
    for a in it:
        if a == "--json":
            out_json = next(it)
        else:
            dirs.append(a)
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    results = [score(d) for d in dirs]
    cols = ["dd_fa", "dd_miss", "dd_pos", "cov_fa", "cov_miss", "dd_rc", "lc_fa", "lc_miss", "rc_wrong", "errors",
            "lc_undet"]
    if any(r.get("family") == "real" for r in results):
        cols = ["dd_fa", "dd_miss", "dd_rc", "cov_fa", "lc_fa", "lc_miss", "rc_wrong", "errors", "lc_undet", "cj_fail",
                "cj_silent", "cause_miss", "unread_miss", "disagree"]
    total = {k: 0 for k in cols}
    clean = 0
    print("%-6s " % "seed" + " ".join("%8s" % k for k in cols))
    for r in sorted(results, key=lambda r: r["seed"]):
        c = counts(r)
        r["counts"] = c
        for k in cols:
            total[k] += c[k]
        clean += all(v == 0 for k, v in c.items() if k != "lc_undet")
        print("%-6d " % r["seed"] + " ".join("%8d" % c[k] for k in cols))
    print("%-6s " % "total" + " ".join("%8d" % total[k] for k in cols))
    print("scenarios: %d, fully clean: %d" % (len(results), clean))
    breakdown(dirs, results)
    if out_json:
        with open(out_json, "w") as fh:
            json.dump({"total": total, "clean": clean, "scenarios": results}, fh, indent=1, default=str)
    return 0 if all(v == 0 for k, v in total.items() if k != "lc_undet") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
