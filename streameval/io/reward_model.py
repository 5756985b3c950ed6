"""The reward model of ``streameval ope --reward-model PATH``: per logged impression, keyed by its
``event_id``, ``reward_hat`` (q_hat(x, a): the model's expected reward of the logged item at its
logged position for that impression's context) and ``dm_value`` (sum_a pi_e(a|x) q_hat(x, a): the
expected reward of the target policy at that position under the model, i.e. obp's
``np.average(estimated_rewards_by_reg_model[i, :, position], weights=action_dist[i, :, position])``).

The file: CSV with a header row, or JSON Lines (``.jsonl``/``.json``: one object per line), with
the fields ``event_id``, ``reward_hat`` and ``dm_value`` (others ignored). Open Bandit CSVs read by
the job get event ids ``<policy>/<campaign>/<row index>`` (:func:`streameval.io.convert.obd_to_impressions`).
No Beam."""

from __future__ import annotations

import csv
import json
import math

__all__ = ["RewardModelTable", "read_reward_model", "REWARD_MODEL_FIELDS"]

REWARD_MODEL_FIELDS = ("event_id", "reward_hat", "dm_value")


def _number(path, where, field, value) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"reward model {path}, {where}: {field} {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"reward model {path}, {where}: {field} {value!r} is not a finite number")
    return x


def read_reward_model(path: str) -> dict:
    """{event_id: (reward_hat, dm_value)} of the file (see the module docstring). Raises ValueError
    (one line: the file, the line, the field) on a missing field, a value that is not a finite
    number, or an event id given twice."""
    out: dict = {}

    def put(where, row):
        missing = [f for f in REWARD_MODEL_FIELDS if row.get(f) in (None, "")]
        if missing:
            raise ValueError(f"reward model {path}, {where}: no {', '.join(missing)} (fields needed: "
                             f"{', '.join(REWARD_MODEL_FIELDS)})")
        eid = str(row["event_id"])
        if eid in out:
            raise ValueError(f"reward model {path}, {where}: event_id {eid!r} given twice")
        out[eid] = (_number(path, where, "reward_hat", row["reward_hat"]),
                    _number(path, where, "dm_value", row["dm_value"]))

    if path.lower().endswith((".jsonl", ".json")):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"reward model {path}, line {lineno}: not JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"reward model {path}, line {lineno}: not a JSON object")
                put(f"line {lineno}", row)
    else:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REWARD_MODEL_FIELDS if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"reward model {path}: no column {', '.join(missing)} in the header (columns "
                                 f"needed: {', '.join(REWARD_MODEL_FIELDS)})")
            for lineno, row in enumerate(reader, 2):
                put(f"line {lineno}", row)
    if not out:
        raise ValueError(f"reward model {path}: no rows")
    return out


class RewardModelTable:
    """Picklable callable impression dict -> ``(reward_hat, dm_value)`` by its ``event_id``, None
    when the table has none."""

    def __init__(self, table: dict):
        self.table = dict(table)

    def __call__(self, rec: dict):
        return self.table.get(str(rec.get("event_id")))
