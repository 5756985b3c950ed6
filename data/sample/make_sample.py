"""Rebuild the bundled demo sample from ../shared/data (see SOURCE.md beside this file).

    python data/sample/make_sample.py [SHARED_DATA_DIR]

Writes impressions/*.avro and judgments/*.avro next to this script:
- Open Bandit Dataset: the six campaign logs (2 logging policies x 3 campaigns, 60,000 impressions
  with clicks and propensities), systems "bts" and "random", attribute "campaign".
- LightGBM lambdarank test sample: 50 queries, 768 judged documents (grades 0-4); two rankers made
  from single feature columns as scores: "feature253" (the strongest single feature by NDCG@10) and
  "feature206" (a median one). Judgments from the labels.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from streameval.io import avro, convert  # noqa: E402


def main(shared: Path) -> None:
    for policy in ("bts", "random"):
        for campaign in ("all", "men", "women"):
            csv = shared / "obd" / policy / campaign / f"{campaign}.csv"
            recs = list(convert.obd_to_impressions(csv, system_id=policy, campaign=campaign))
            avro.write_records(HERE / "impressions" / f"obd_{policy}_{campaign}.avro", "impression", recs)
    letor = shared / "letor_lightgbm"
    for feature in (253, 206):
        imps, judg = convert.letor_to_records(letor / "rank.test", letor / "rank.test.query", feature=feature)
        avro.write_records(HERE / "impressions" / f"letor_feature{feature}.avro", "impression", imps)
    avro.write_records(HERE / "judgments" / "letor_test_labels.avro", "judgment", judg)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "shared" / "data")
