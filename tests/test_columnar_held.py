"""Values the columnar engine holds in its process, and the read stage's NUL screen (issue 22 item 3 (a)):
the read stage's held parts (run columns moved by their runs) against the pickled parts (every row
taken on its own), held AUC states against the states themselves, and the one-pass NUL check against
Arrow's per-row substring match."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from streameval.beam import columnar_columns as cc


def _chunk(rng, n_requests: int, nulls: bool):
    """Impression-like columns: requests of 1 to 12 adjacent records sharing request, query, user,
    system and device (now and then a query or device changing inside a request, some nulls)."""
    sizes = rng.integers(1, 13, n_requests)
    req = np.repeat(np.arange(n_requests), sizes)
    n = len(req)
    query = np.repeat(rng.integers(0, 30, n_requests), sizes)
    flip = rng.random(n) < 0.03
    query[flip] = rng.integers(0, 30, int(flip.sum()))
    user = [None if nulls and u % 7 == 0 else f"u{u}" for u in np.repeat(rng.integers(0, 50, n_requests), sizes)]
    device = [None if nulls and d == 2 else ["pc", "sp", "tv"][d] for d in np.repeat(rng.integers(0, 3, n_requests),
                                                                                     sizes)]
    return {"n": n, "event_id": pa.array([f"e{i}" for i in range(n)]),
            "request_id": pa.array([f"r{r}" for r in req]), "query_id": pa.array([f"q{q}" for q in query]),
            "user_id": pa.array(user, pa.string()), "system_id": pa.array([f"s{r % 2}" for r in req]),
            "item_id": pa.array([f"d{i}" for i in rng.integers(0, 100, n)]),
            "position": rng.integers(1, 20, n).astype(np.int64), "score": rng.random(n),
            "clicked": (rng.random(n) < 0.1).astype(np.int8), "timestamp": rng.integers(0, 10**9, n),
            "attributes": {"device": pa.array(device, pa.string())}}


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        if k == "n":
            assert a[k] == b[k]
        elif k == "attributes":
            assert a[k].keys() == b[k].keys()
            for x in a[k]:
                assert a[k][x].type == b[k][x].type and a[k][x].equals(b[k][x]), x
        elif isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k].type == b[k].type and a[k].equals(b[k]), k


@pytest.mark.parametrize("seed", range(6))
def test_held_split_equals_rows_taken_one_by_one(seed):
    """_split(hold=True) (the run columns reordered by their runs, as run-end encoded slices) gives,
    shard by shard, the columns of the rows of that shard in their order: the same as the pickled
    parts (each row taken on its own) and as a direct take of the shard's rows; also for rows in
    random order (runs of one row: the plain take), and for one shard."""
    rng = np.random.default_rng(seed)
    chunk = _chunk(rng, int(rng.integers(1, 400)), nulls=seed % 2 == 0)
    if seed >= 4:  # rows shuffled: no runs
        chunk = cc._take(chunk, rng.permutation(chunk["n"]))
    runs = ("request_id", "query_id", "user_id", "system_id", "attributes")
    for shards in (1, 3, 16):
        shard = cc._shards_of(chunk["system_id"], chunk["request_id"], shards)
        held = [(s, cc.thaw(v)) for s, v in cc._split(chunk, shard, runs, hold=True)]
        pickled = [(s, cc.thaw(v)) for s, v in cc._split(chunk, shard, runs, hold=False)]
        assert [s for s, _ in held] == [s for s, _ in pickled] == sorted(set(shard.tolist()))
        for (s, h), (_, p) in zip(held, pickled):
            _same(h, p)
            _same(h, cc._take(chunk, np.flatnonzero(shard == s)))
    cc.release_held()


def test_runs_in_order_keeps_the_values_of_every_row():
    """_runs_in_order against a direct take in the shard order, with stretches of equal values
    crossing shard changes and nulls next to equal strings (null is a value of its own)."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(0, 300))
        vals = rng.choice(np.array(["a", "b", None, ""], dtype=object), n).tolist()
        reps = rng.integers(1, 30, n)
        col = pa.array([v for v, r in zip(vals, reps) for _ in range(r)][:n], pa.string())
        shard = np.repeat(rng.integers(0, 4, n), rng.integers(1, 8, n))[:n]
        got = cc._runs_in_order(col, shard)
        want = cc._pick(col, cc._group_bounds(shard)[0])
        plain = pc.run_end_decode(got) if pa.types.is_run_end_encoded(got.type) else got
        assert plain.equals(want)


def test_no_nul_of_slices_equals_a_substring_match():
    """_no_nul (one pass over the rows' bytes when none is NUL) equals Arrow's per-row match, for
    slices of string and large string arrays with NULs, nulls and empty strings anywhere."""
    rng = np.random.default_rng(5)
    pool = np.array(["ab", "", None, "c\x00d", "\x00", "xyz"], dtype=object)
    for _ in range(300):
        vals = rng.choice(pool, int(rng.integers(0, 12))).tolist()
        for t in (pa.string(), pa.large_string()):
            a = pa.array(vals, t)
            lo = int(rng.integers(0, len(vals) + 1))
            s = a.slice(lo, int(rng.integers(0, len(vals) - lo + 1)))
            has = pc.fill_null(pc.match_substring(s, "\x00"), False)
            assert cc._no_nul(s).tolist() == [not h for h in has.to_pylist()]


def test_held_auc_states_merge_as_the_states_themselves():
    """CountsCombineFn(hold=True) on keys of held CountArrays states (as the clean stage gives them on
    Beam's in-process runner) gives the output of CountsCombineFn on the states, through add_input,
    compact, merge_accumulators and extract_output in any grouping; the held states are taken (none
    left), and a key not held in this process is a clear error."""
    from streameval.accumulators.online import CountArrays
    from streameval.beam import columnar_online as co

    rng = np.random.default_rng(2)
    states = []
    for _ in range(150):
        n = int(rng.integers(1, 50))
        score = np.round(rng.random(n), 2)  # ties across states
        states.extend(s for _, s in CountArrays.by_key(np.zeros(n, np.int64), score, rng.random(n) < 0.3))
    for kind in ("auc", "auc_hist"):
        plain = co.CountsCombineFn(kind)
        want = plain.extract_output(plain.merge_accumulators([
            plain.compact(_added(plain, states[:70])), _added(plain, states[70:])]))
        held = co.CountsCombineFn(kind, hold=True)
        keys = [co._hold_counts(s) for s in states]
        assert all(isinstance(k, str) for k in keys)
        accs = [held.compact(_added(held, keys[:70])), _added(held, keys[70:100]), _added(held, keys[100:])]
        assert all(isinstance(s, str) for a in accs for s in a)
        got = held.extract_output(held.merge_accumulators(accs))
        assert repr(got) == repr(want)
        assert not cc._HELD
        with pytest.raises(RuntimeError, match="held in another process"):
            held.extract_output([keys[0]])


def _added(fn, states):
    acc = fn.create_accumulator()
    for s in states:
        acc = fn.add_input(acc, s)
    return acc
