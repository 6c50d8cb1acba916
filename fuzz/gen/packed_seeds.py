"""Write the pt fuzz target's seeds for packed lists: small torch.save archives whose
data.pkl holds token-list trajectories in pickle protocols 0, 1 and 2 (protocol 0: MARK
LIST + one APPEND per item, text INT/LONG/FLOAT, I01/I00 bools; protocol 1: MARK ...
APPENDS batches with binary ints, text LONG, BINFLOAT, text bools; protocol 2: BININT*,
LONG1, NEWTRUE/NEWFALSE), and one .jsonl dump of the same lists for the json target.

    python3 fuzz/gen/packed_seeds.py      # writes fuzz/corpus/{pt,json}/seed-packed-*
"""
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OBJ = {
    "trajectories": [
        {
            "tokens": [1, 2, 300, 70000, 151935] * 3,
            "loss_mask": [0, 0, 1, 1, 1] * 3,
            "reward": 0.5,
            "flags": [True, False, True],
            "scores": [0.25, -2.0, float("inf")],
            "big": [1, 2**40, -(2**35)],
            "mixed": [1, 2.5, "x", None],
        }
    ],
    "advantages": [0.125, -0.5],
    "old_log_probs": torch.tensor([[-0.5, -1.25]]),
}

for proto in (0, 1, 2):
    path = os.path.join(HERE, "..", "corpus", "pt", f"seed-packed-proto{proto}.pt")
    # Protocol 0 cannot carry torch's tuple persistent ids: no tensor there.
    obj = {k: v for k, v in OBJ.items() if proto > 0 or k != "old_log_probs"}
    torch.save(obj, path, pickle_protocol=proto)

plain = dict(OBJ, old_log_probs=OBJ["old_log_probs"].tolist())
plain["trajectories"][0]["scores"] = [0.25, -2.0, float("-inf")]
with open(os.path.join(HERE, "..", "corpus", "json", "seed-packed-lists.jsonl"), "w") as f:
    f.write(json.dumps(plain) + "\n")
