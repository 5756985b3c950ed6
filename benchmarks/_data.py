"""Synthetic data of the benchmarks (benchmarks/run.py), made once and saved as .npy files so each
engine's process only loads arrays: its peak memory is then its own work plus the arrays, not the
generator's temporaries.

Ranking collection (the issue's shape): ``queries`` x ``docs`` retrieved documents (run rows) and
``judged`` graded judgments per query (grades 0-4), integer ids: query q retrieves documents
q*100000 + 10*j + u_j (j < docs, u_j random in 0..9, so distinct); half the judgments are on
retrieved documents (every other rank), half on documents nobody retrieved. Scores are a random
permutation of (1..docs)/(docs+1) per query: distinct within a query even in single precision,
so no engine's tie-breaking rule matters and every engine must give the same numbers.

Online data: ``rows`` impressions with a score and a click label (about 10 % clicked; scores
higher for clicks, so AUC is about 0.8), and a user id among ``users`` for GAUC.
"""

from __future__ import annotations

import os

import numpy as np

RANKING = ("rq", "rd", "rs", "jq", "jd", "jg")


def ranking(n_queries: int, n_docs: int = 100, n_judged: int = 40, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    q = np.arange(n_queries, dtype=np.int64)[:, None]
    local = np.arange(n_docs, dtype=np.int64)[None, :] * 10 + rng.integers(0, 10, size=(n_queries, n_docs))
    rq = np.repeat(np.arange(n_queries, dtype=np.int64), n_docs)
    rd = (q * 100_000 + local).ravel()
    perm = np.tile(np.arange(1, n_docs + 1, dtype=np.float64), (n_queries, 1))
    rng.permuted(perm, axis=1, out=perm)
    rs = (perm / (n_docs + 1)).ravel()
    del perm
    half = n_judged // 2
    judged_ret = local[:, : 2 * half : 2]
    judged_new = 50_000 + np.arange(n_judged - half, dtype=np.int64)[None, :] + np.zeros((n_queries, 1), np.int64)
    jq = np.repeat(np.arange(n_queries, dtype=np.int64), n_judged)
    jd = (q * 100_000 + np.concatenate([judged_ret, judged_new], axis=1)).ravel()
    jg = rng.integers(0, 5, size=len(jq)).astype(np.int64)
    return dict(rq=rq, rd=rd, rs=rs, jq=jq, jd=jd, jg=jg)


def online(n_rows: int, n_users: int, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    click = rng.random(n_rows) < 0.1
    score = rng.random(n_rows) * 0.7 + 0.3 * click * rng.random(n_rows)
    user = rng.integers(0, n_users, size=n_rows).astype(np.int64)
    return dict(score=score, click=click, user=user)


def save(dirname: str, arrays: dict) -> None:
    os.makedirs(dirname, exist_ok=True)
    for k, v in arrays.items():
        np.save(os.path.join(dirname, k + ".npy"), v)


def load(dirname: str, names=None) -> dict:
    names = names or [f[:-4] for f in sorted(os.listdir(dirname)) if f.endswith(".npy")]
    return {k: np.load(os.path.join(dirname, k + ".npy")) for k in names}


def cached(dirname: str, make, *args, **kw) -> str:
    """Make the arrays into ``dirname`` unless they are there already (a ``.done`` marker)."""
    if not os.path.exists(os.path.join(dirname, ".done")):
        save(dirname, make(*args, **kw))
        open(os.path.join(dirname, ".done"), "w").close()
    return dirname


def write_trec(dirname: str, arrays: dict) -> tuple[str, str]:
    """The ranking collection as TREC text files with string ids (``q<n>``, ``d<n>``): run
    ``qid Q0 docno rank score tag``, each query's lines in rank order (as run files are), and
    qrels ``qid 0 docno grade``. Returns (qrels path, run path); kept when already written."""
    qrels_path, run_path = os.path.join(dirname, "qrels.txt"), os.path.join(dirname, "run.txt")
    if os.path.exists(os.path.join(dirname, ".trec_done")):
        return qrels_path, run_path
    rq, rd, rs, jq, jd, jg = (arrays[k] for k in RANKING)
    n_docs = int(np.bincount(rq).max()) if len(rq) else 0
    chunk = 200_000 * max(n_docs, 1) // 100
    with open(run_path, "w") as f:
        for lo in range(0, len(rq), chunk):
            q, d, s = rq[lo:lo + chunk], rd[lo:lo + chunk], rs[lo:lo + chunk]
            nq = len(q) // n_docs
            order = np.argsort(-s.reshape(nq, n_docs), axis=1, kind="stable")
            base = (np.arange(nq) * n_docs)[:, None]
            idx = (order + base).ravel()
            rank = np.tile(np.arange(1, n_docs + 1), nq)
            f.write("".join(f"q{a} Q0 d{b} {r} {c:.6f} bench\n"
                            for a, b, r, c in zip(q[idx].tolist(), d[idx].tolist(), rank.tolist(), s[idx].tolist())))
    with open(qrels_path, "w") as f:
        for lo in range(0, len(jq), 1_000_000):
            f.write("".join(f"q{a} 0 d{b} {g}\n" for a, b, g in zip(jq[lo:lo + 1_000_000].tolist(),
                                                                     jd[lo:lo + 1_000_000].tolist(),
                                                                     jg[lo:lo + 1_000_000].tolist())))
    open(os.path.join(dirname, ".trec_done"), "w").close()
    return qrels_path, run_path
