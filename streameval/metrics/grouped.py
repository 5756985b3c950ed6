"""Fast path of :func:`~streameval.metrics.prepare.prepare` for the usual layout of a run: each
query's rows contiguous (any query order, any row order inside a query), as TREC run files and most
in-memory runs are. Same result as the general path, bit for bit (a property test checks it).

How: query ids are coded by run-length blocks (O(N), no sort of the run); integer docnos are coded
by keys that order as their text (``prepare.TextKeys``: arithmetic, a chunk at a time, no sort;
strings are factorised); each query becomes one row of a padded 2-D array and is sorted on its own
(``argsort(axis=1)`` on short rows is far faster than one global sort), by the scores rounded to
float32; ties there are resolved, on the few rows that have any, by the doubles (the default,
trec_eval 10's comparison; the rounding is monotone, so the other rows are in the doubles' order
already) and by docno; the join with the qrels uses needles already sorted by (query, docno), so
``searchsorted`` walks memory in order.

Memory: the run is laid out a chunk of whole queries at a time (about :data:`CHUNK_ROWS` rows),
straight into the output, so the temporaries are bounded by a chunk, not the collection.

Returns None when the layout does not fit (a query split in several blocks, or rows so unequal that
padding would more than double the memory); the caller then takes the general path.
"""

from __future__ import annotations

import numpy as np

from .errors import judged_twice, ranked_twice
from .kernel import RankedLists
from .parallel import run_tasks as _run_tasks

__all__ = ["prepare_grouped"]

_MAX_KEY = 2**62
#: rows of the run laid out per chunk (whole queries; a query longer than this is one chunk)
CHUNK_ROWS = 1 << 17  # (~8 MB of temporaries: reused chunk after chunk, few fresh pages to fault in)
_CODE_CHUNK = 1 << 15


def _unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` by a sort (numpy 2's hash-based unique is several times slower on ids)."""
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


def _differs(a: np.ndarray) -> np.ndarray:
    """``a[1:] != a[:-1]``; ``bytes`` and ``str`` ids compared as the 64-bit (or 32-bit) words of
    their zero-padded storage (equal ids, equal bytes: numpy pads with NULs and no id ends in one)
    when that takes at most 8 words, far faster than comparing them as strings."""
    size = a.dtype.itemsize
    if a.dtype.kind in "SU" and size and a.flags.c_contiguous and len(a) > 1:
        word = np.uint64 if size % 8 == 0 else np.uint32 if size % 4 == 0 else None
        if word is not None and size // np.dtype(word).itemsize <= 8:
            w = a.view(word).reshape(len(a), -1)
            out = w[1:, 0] != w[:-1, 0]
            for j in range(1, w.shape[1]):
                out |= w[1:, j] != w[:-1, j]
            return out
    return a[1:] != a[:-1]


def _blocks(a: np.ndarray):
    """Run-length blocks of a 1-D array: (values, lengths, starts)."""
    n = len(a)
    if n == 0:
        return a[:0], np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(_differs(a)) + 1)).astype(np.int64)
    return a[starts], np.diff(np.append(starts, n)), starts


class _Bytes:
    """The bytes of a ``bytes`` array, or the code points of a ``str`` array, as a (ids x
    positions) view of numpy's storage (zero past each id's end: numpy's padding), handed out a
    block of ids at a time laid out by position (:meth:`block`): no matrix of the whole array is
    made (its fresh pages cost more than the work; and memory)."""

    def __init__(self, a: np.ndarray):
        n = len(a)
        if a.dtype.kind == "S":
            self.width = a.dtype.itemsize
            unit = np.uint8
        else:
            self.width = a.dtype.itemsize // 4
            unit = np.uint32
        self.n = n
        self.src = np.ascontiguousarray(a).view(unit).reshape(n, self.width) if self.width and n else None

    def block(self, rows) -> np.ndarray:
        """(positions x ids) uint8 of the ids ``rows`` (a slice or indices); code points above 255
        wrap (ASCII is checked by :meth:`top`)."""
        if self.src is None:
            return np.zeros((self.width, len(range(self.n)[rows]) if isinstance(rows, slice) else len(rows)),
                            dtype=np.uint8)
        sub = self.src[rows]
        out = np.empty((self.width, len(sub)), dtype=np.uint8)
        np.copyto(out, sub.T, casting="unsafe")
        return out

    def top(self, rows) -> int:
        """The largest code point of the ids ``rows`` (a ``str`` array is ASCII when it is below 128)."""
        return int(self.src[rows].max()) if self.src is not None and self.src.dtype != np.uint8 else 0


def _ascii_codes(*arrays: np.ndarray, lazy: bool = False):
    """Integer codes of the ids of several ``str`` arrays (ASCII) or ``bytes`` arrays that order as
    the ids do (code-point / byte order, a prefix first), or None when a ``str`` is not ASCII or
    the codes need more than 62 bits. All arrays ``str`` or all ``bytes``.

    Position by position (character index), the bytes that occur are numbered in order, end of
    string (NUL padding) lowest, and a position's number takes just the bits its count needs (none
    for a position that never changes); the positions' numbers are concatenated, first character
    highest. Comparing two codes is then comparing the ids byte by byte: ids such as
    ``d1234567890`` or ``clueweb09-en0000-00-00000`` take a few bits per varying position. First
    each position numbers the whole range of bytes between its smallest and its largest (no table
    of which occur: cheaper); when that needs more than 62 bits, only the bytes that occur. O(n x
    length), no sort, a cache-sized block of ids at a time.

    ``lazy``: ``(numbering, byte matrices, codes of the arrays but the first)``, the first array's
    codes made later, a block at a time, where they are used (:class:`_Codes`; every code is below
    ``numbering.nd``; the arrays' bytes as :class:`_Bytes`)."""
    mats = [_Bytes(a) for a in arrays]
    width = max((m.width for m in mats), default=0)
    if width == 0:
        return [np.zeros(m.n, dtype=np.int64) for m in mats]
    step = _CODE_CHUNK
    # per position: smallest non-NUL byte, largest byte, whether NUL (end of string) occurs; a block
    # of ids at a time (one contiguous row per position: fast reductions)
    lo = np.full(width, 256, dtype=np.int64)
    hi = np.zeros(width, dtype=np.int64)
    nul = np.zeros(width, dtype=bool)

    def stats(m, r0):  # (16 blocks of ids) -> also the largest code point, None past 127
        w = m.width
        top, low, has_nul = np.zeros(w, np.uint8), np.full(w, 255, np.uint8), np.zeros(w, bool)
        for r in range(r0, min(r0 + step * 16, m.n), step):
            if m.top(slice(r, r + step)) >= 128:
                return None
            sub = m.block(slice(r, r + step))
            np.maximum(top, sub.max(axis=1), out=top)
            sub -= np.uint8(1)  # NUL wraps to 255: the minimum is the smallest non-NUL byte - 1
            np.minimum(low, sub.min(axis=1), out=low)
            has_nul |= (sub == 255).any(axis=1)
        return top, low.astype(np.int64) + 1, has_nul

    for m in mats:
        w = m.width
        if w < width and m.n:
            nul[w:] = True
        for part in _run_tasks([(stats, (m, r)) for r in range(0, m.n, step * 16)]):
            if part is None:
                return None  # a str that is not ASCII
            top, low, has_nul = part
            np.maximum(hi[:w], top, out=hi[:w])
            np.minimum(lo[:w], low, out=lo[:w])
            nul[:w] |= has_nul
    # a position that is NUL everywhere: lo stays 256, no byte symbols
    counts = (hi - lo + 1).clip(0) + nul
    table = None
    if int(sum((int(c) - 1).bit_length() for c in counts)) > 62:
        # only the bytes that occur, numbered through a table
        present = np.zeros((width, 256), dtype=bool)
        for m in mats:
            w = m.width
            base = (np.arange(w, dtype=np.intp) * 256)[:, None]
            flat = present[:w].reshape(-1)
            for r in range(0, m.n, step):
                flat[(m.block(slice(r, r + step)) + base).ravel()] = True
        present[:, 0] |= nul
        table = (np.cumsum(present, axis=1) - 1).clip(0).astype(np.uint8)
        counts = present.sum(axis=1)
    bits = [(int(c) - 1).bit_length() for c in counts]
    if sum(bits) > 62:
        return None
    # positions that vary, in groups of at most 16 bits: a group's code is built in uint16 (cheap),
    # then shifted into the 64-bit key
    groups: list[list[int]] = []
    for j in range(width):
        if bits[j]:
            if groups and sum(bits[i] for i in groups[-1]) + bits[j] <= 16:
                groups[-1].append(j)
            else:
                groups.append([j])
    codes = _Codes(bits, groups, lo, nul, table)
    # (lazy: no codes for the first array)
    keys = [np.zeros(m.n if i or not lazy else 0, dtype=np.uint64) for i, m in enumerate(mats)]
    _run_tasks([(codes.encode_rows, (m, slice(r, r + step * 16), k[r:r + step * 16]))
                for m, k in zip(mats, keys) for r in range(0, len(k), step * 16)])
    if lazy:
        return codes, mats, [k.view(np.int64) for k in keys[1:]]
    return [k.view(np.int64) for k in keys]


class _Codes:
    """How :func:`_ascii_codes` numbers ids (per position: bits, first byte, whether NUL occurs,
    or a byte table); ``encode`` applies it to columns of a byte matrix, so that the codes of a big
    array can be made a block at a time where they are used. ``nd``: every code is below it."""

    def __init__(self, bits, groups, lo, nul, table):
        self.bits, self.groups, self.lo, self.nul, self.table = bits, groups, lo, nul, table
        self.nd = 1 << sum(bits)

    def encode_rows(self, ids: _Bytes, rows, out: np.ndarray | None = None) -> np.ndarray:
        """Codes (uint64) of the ids ``rows`` (a slice or indices) of ``ids``, a block at a time,
        written into ``out`` (zeros) if given."""
        n = len(range(ids.n)[rows]) if isinstance(rows, slice) else len(rows)
        k = np.zeros(n, dtype=np.uint64) if out is None else out
        start = (rows.start or 0) if isinstance(rows, slice) else 0
        for r in range(0, n, _CODE_CHUNK):
            part = slice(start + r, start + min(r + _CODE_CHUNK, n)) if isinstance(rows, slice) \
                else rows[r:r + _CODE_CHUNK]
            self.encode(ids.block(part), k[r:r + _CODE_CHUNK])
        return k

    def encode(self, m: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Codes (uint64) of the ids (columns) of byte matrix ``m`` (positions x ids, as
        :meth:`_Bytes.block` lays it out), written into ``out`` (zeros) if given."""
        bits, lo, nul, table = self.bits, self.lo, self.nul, self.table
        w, n = m.shape
        k = np.zeros(n, dtype=np.uint64) if out is None else out
        for r in range(0, n, _CODE_CHUNK):
            sub = m[:, r:r + _CODE_CHUNK]  # one row per position
            kr = k[r:r + _CODE_CHUNK]
            for g in self.groups:
                gv = None
                for j in g:
                    if j >= w:  # past this array's width: NUL, number 0
                        c = np.zeros(sub.shape[1], dtype=np.uint8)
                    elif table is not None:
                        c = table[j][sub[j]]
                    else:  # byte - lo + 1 (NUL: 0), or byte - lo when NUL does not occur here
                        c = sub[j] - np.uint8(lo[j] - nul[j])
                        if nul[j]:
                            c *= sub[j] != 0
                    if gv is None:
                        gv = c.astype(np.uint16)
                    else:
                        gv <<= np.uint16(bits[j])
                        gv |= c
                kr <<= np.uint64(sum(bits[j] for j in g))
                kr |= gv
        return k


def prepare_grouped(rq, rd, score, jq, jd, jgrade, *, depth, complete, score_precision, as_key_array,
                    factorize, judgment_histogram, prepared_cls, text_keys):
    """See the module docstring. Arguments as :func:`prepare` (already validated), plus the
    helpers it shares (to keep one definition of each step)."""
    runs = getattr(rq, "blocks", None)  # ids given as runs of equal ids (trec._RunLengths)
    rbv, rbl, rbs = runs() if runs is not None else _blocks(as_key_array(rq))
    jq = as_key_array(jq)
    if len(rbv) and len(jq) and rbv.dtype.kind != jq.dtype.kind:
        rbv, jq = rbv.astype(str), jq.astype(str)
    jbv, jbl, _ = _blocks(jq)
    # integer query ids order as their text: coded by their text keys (only the blocks' ids)
    qkeys = text_keys(rbv, jbv) if (rbv if len(rbv) else jbv).dtype.kind in "iu" else None
    if qkeys is not None:
        rbv, jbv = qkeys.keys(rbv), qkeys.keys(jbv)
    elif (rbv if len(rbv) else jbv).dtype.kind in "iu":  # too long for keys: as text
        rbv, jbv = rbv.astype(str), jbv.astype(str)
    qvocab = _unique(np.concatenate((rbv, jbv)))
    rbc = np.searchsorted(qvocab, rbv).astype(np.int64)  # query code of each run block
    if len(_unique(rbc)) != len(rbc):
        return None  # a query's rows are not contiguous
    jbc = np.searchsorted(qvocab, jbv).astype(np.int64)
    jqc = np.repeat(jbc, jbl)
    nq = max(len(qvocab), 1)
    if qkeys is not None:
        qvocab = qkeys.ids(qvocab)  # the ids, in text order

    # -- docno codes: integers by their text keys (made where they are used), strings factorised
    rd, jd = as_key_array(rd), as_key_array(jd)
    dkeys = text_keys(rd, jd) if rd.dtype.kind in "iu" and jd.dtype.kind in "iu" and (len(rd) or len(jd)) \
        else None
    if dkeys is not None:
        nd = dkeys.limit
        if nq * nd >= _MAX_KEY:
            return None
        jdc = dkeys.keys(jd)

        def run_codes(rows):  # the run's codes are made a chunk at a time
            return dkeys.keys(rd[rows])

        def docno_of(code):
            return dkeys.ids([code])[0]
    else:
        lazy = _ascii_codes(rd, jd, lazy=True) if rd.dtype.kind == jd.dtype.kind and rd.dtype.kind in "US" else None
        if lazy is not None and nq * lazy[0].nd < _MAX_KEY:
            # ASCII ids: integer codes in string order straight from the characters, no sort; the
            # run's made a chunk at a time, where they are used
            numbering, (rmat, jmat), (jdc,) = lazy
            nd = numbering.nd

            def run_codes(rows):
                return numbering.encode_rows(rmat, rows).view(np.int64)

            def docno_of(code):  # only for error messages
                for ids, m in ((rd, rmat), (jd, jmat)):
                    c = numbering.encode_rows(m, slice(0, m.n)).view(np.int64)
                    hit = np.flatnonzero(c == code)
                    if len(hit):
                        return ids[hit[0]]
        else:
            dvocab, (rdc, jdc) = factorize(rd, jd)
            nd = max(len(dvocab), 1)

            def run_codes(rows):
                return np.asarray(rdc[rows], dtype=np.int64)

            def docno_of(code):
                return dvocab[code]
        del lazy

    # -- which queries are evaluated
    judged_queries = _unique(jbc)
    run_queries = np.sort(rbc)
    unjudged = np.setdiff1d(run_queries, judged_queries, assume_unique=True)
    evaluated = judged_queries if complete else np.intersect1d(run_queries, judged_queries, assume_unique=True)
    missing = np.setdiff1d(judged_queries, run_queries, assume_unique=True)
    eval_pos = np.full(len(qvocab), -1, dtype=np.int64)
    eval_pos[evaluated] = np.arange(len(evaluated))

    # -- qrels sorted by (query, docno); duplicates refused
    jkey_s, jgrade_s = _sorted_qrels(jqc, jdc, jgrade, nd, qvocab, docno_of)
    del jdc

    # -- the run's blocks of evaluated queries, one padded row each, a chunk of blocks at a time
    kb = np.flatnonzero(eval_pos[rbc] >= 0)
    # ... in the evaluated queries' order (the output's): a chunk then joins with one stretch of the
    # sorted qrels and writes one stretch of the output (a run whose queries are not in text order,
    # such as integer ids 1, 2, ..., 10, has its blocks gathered, not sliced)
    kb = kb[np.argsort(eval_pos[rbc[kb]], kind="stable")]
    lens, bstart, qrow = rbl[kb], rbs[kb], rbc[kb]
    nb = len(lens)
    L = int(lens.max()) if nb else 0
    n_kept = int(lens.sum())
    if nb == 0 or nb * L > 2 * n_kept + 4096:
        return None
    lens_cut = lens if depth is None else np.minimum(lens, depth)
    qpos = eval_pos[qrow]
    counts = np.zeros(len(evaluated), dtype=np.int64)
    counts[qpos] = lens_cut
    offsets = np.zeros(len(evaluated) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    grades = np.empty(int(offsets[-1]), dtype=np.float64)
    doubles = score_precision != "float32"  # float64: ties in float32 resolved by the doubles
    # chunks of whole blocks of about CHUNK_ROWS rows bound the temporaries (~60 bytes a row)
    ends = np.cumsum(lens)
    cuts = np.unique(np.searchsorted(ends, np.arange(CHUNK_ROWS, n_kept, CHUNK_ROWS), side="right"))
    bounds = [0, *[int(c) for c in cuts if 0 < c < nb], nb]
    # the chunks write disjoint parts of ``grades``: on two threads (numpy releases the GIL in its
    # sorts and loops), the judgment histogram alongside; an error is the first chunk's, in order
    tasks = [(_chunk, (slice(b0, b1), lens, bstart, qrow, qpos, lens_cut, offsets, grades, score, run_codes,
                       nd, jkey_s, jgrade_s, doubles, depth, qvocab, docno_of))
             for b0, b1 in zip(bounds[:-1], bounds[1:])]
    tasks.append((lambda: judgment_histogram(eval_pos[jqc], jgrade, len(evaluated)), ()))  # (counts: any order)
    joff, hvals, hcounts = _run_tasks(tasks)[-1]
    return prepared_cls(
        qids=qvocab[evaluated],
        lists=RankedLists(offsets, grades, joff, hvals, hcounts),
        unjudged_qids=qvocab[unjudged],
        missing_qids=qvocab[missing],
    )


def _sorted_qrels(jqc, jdc, jgrade, nd, qvocab, docno_of):
    """The qrels' join keys (query code x ``nd`` + docno code) sorted and their grades (float64
    ``jgrade``) in that order; ValueError for a (query, docno) judged twice."""
    jkey = np.multiply(jqc, nd)
    jkey += jdc
    if len(jkey) >= 2 and not bool(np.all(jkey[1:] > jkey[:-1])):  # (qrels files are usually in order)
        jorder = np.argsort(jkey, kind="stable")  # (timsort: fast on qrels grouped by query)
        jkey, jgrade = jkey[jorder], jgrade[jorder]
    if len(jkey):
        dup = np.flatnonzero(jkey[1:] == jkey[:-1])
        if len(dup):
            key = jkey[dup[0]]
            raise judged_twice(docno_of(key % nd), qvocab[key // nd])
    return jkey, jgrade


def _join(keys: np.ndarray, cq: np.ndarray, nd: int, jkey_s: np.ndarray, jgrade_s: np.ndarray) -> np.ndarray:
    """The grades (float64, NaN: not judged) of the join keys ``keys`` (1-D) of a chunk whose query
    codes are ``cq``: searched only in the qrels of those queries (a slice: fewer cache misses)."""
    if not len(jkey_s):
        return np.full(len(keys), np.nan)
    lo, hi = np.searchsorted(jkey_s, [int(cq.min()) * nd, (int(cq.max()) + 1) * nd])
    lo, hi = int(lo), max(int(hi), int(lo) + 1)
    hit = np.searchsorted(jkey_s[lo:hi], keys)
    hit += lo
    np.minimum(hit, len(jkey_s) - 1, out=hit)
    found = jkey_s[hit] == keys
    g = jgrade_s[hit]
    g[~found] = np.nan
    return g


def _chunk(sel, lens, bstart, qrow, qpos, lens_cut, offsets, grades, score, run_codes, nd, jkey_s, jgrade_s,
           doubles, depth, qvocab, docno_of):
    """Lay out the run blocks ``sel`` (consecutive kept blocks) and write their grades, in rank
    order, into ``grades`` at their queries' ``offsets``.

    Each row is sorted by its scores rounded to float32 (half the memory of doubles; the rounding is
    monotone, so a strict order there is the doubles' order); the rows with a tie there are sorted
    again by (score, docno), with ``doubles`` the scores as doubles (trec_eval 10), else the float32
    values (trec_eval 9)."""
    cl, cs, cq = lens[sel], bstart[sel], qrow[sel]
    nbc = len(cl)
    Lc = int(cl.max())
    nc = int(cl.sum())
    lo = int(cs[0])
    if bool(np.all(cs[1:] == cs[:-1] + cl[:-1])):  # each block follows the last in the run: a slice
        rows = slice(lo, lo + nc)
    else:
        rows = np.arange(nc) + np.repeat(cs - (np.cumsum(cl) - cl), cl)
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf (trec_eval 9's; ties for the doubles)
        neg = np.asarray(score[rows], dtype=np.float64).astype(np.float32)
    np.negative(neg, out=neg)
    d = run_codes(rows)
    if nc == nbc * Lc:  # every query of the chunk has Lc rows (a run cut at a fixed depth): reshapes
        S = neg.reshape(nbc, Lc)
        D = d.reshape(nbc, Lc)
    else:
        # flat position of each row in the padded array: block b starts at b*Lc
        flat = np.arange(nc) + np.repeat(np.arange(nbc) * Lc - (np.cumsum(cl) - cl), cl)
        S = np.full(nbc * Lc, np.nan, dtype=np.float32)
        S[flat] = neg
        S = S.reshape(nbc, Lc)
        D = np.full(nbc * Lc, -1, dtype=np.int64)
        D[flat] = d
        D = D.reshape(nbc, Lc)
        del flat
    del neg, d

    # docno order inside each row (``dorder``; None: the rows list their docnos in order already, the
    # padding last): a docno ranked twice for one query is refused; the join below searches with each
    # row's keys in this order (in-order needles walk the qrels forward)
    if bool(((D[:, 1:] >= D[:, :-1]) | (D[:, 1:] < 0)).all()):
        dorder, Ds = None, D
    else:
        dorder = np.argsort(D, axis=1)
        Ds = np.take_along_axis(D, dorder, axis=1)
    dupmask = (Ds[:, 1:] == Ds[:, :-1]) & (Ds[:, 1:] >= 0)
    if dupmask.any():
        r, c = np.argwhere(dupmask)[0]
        raise ranked_twice(docno_of(Ds[r, c]), qvocab[cq[r]])
    del dupmask

    # rank order: score descending (the padding, NaN, sorts last and ties nothing), first as float32;
    # ties there (rare) by the doubles (``doubles``) and by docno descending, on the rows that have them. Run files usually list each query's documents
    # by score already: then nothing is sorted (NaN padding compares False: never out of order).
    if bool((S[:, 1:] < S[:, :-1]).any()):
        perm = np.argsort(S, axis=1)
        Ss = np.take_along_axis(S, perm, axis=1)
    else:
        perm, Ss = None, S
    eq = Ss[:, 1:] == Ss[:, :-1]
    rows_t = np.flatnonzero(eq.any(axis=1)) if bool(eq.any()) else np.zeros(0, np.intp)
    del Ss, eq
    if len(rows_t):
        if perm is None:
            perm = np.broadcast_to(np.arange(Lc), S.shape).copy()
        if doubles:  # those rows by their doubles; the rows with a tie there, by docno too
            St = _doubles_of(rows_t, cl, Lc, rows, score)
            if bool((St[:, 1:] < St[:, :-1]).any()):
                pt = np.argsort(St, axis=1)
                Sts = np.take_along_axis(St, pt, axis=1)
                perm[rows_t] = pt
                del pt
            else:
                perm[rows_t] = np.arange(Lc)
                Sts = St
            tied = (Sts[:, 1:] == Sts[:, :-1]).any(axis=1)
            del Sts
            rows_t, St = rows_t[tied], St[tied]
        else:
            St = S[rows_t]
        if len(rows_t):
            sub = np.lexsort((-D[rows_t].ravel(), St.ravel(), np.repeat(np.arange(len(rows_t)), Lc)))
            perm[rows_t] = (sub % Lc).reshape(len(rows_t), Lc)
        del St
    del S
    width = Lc if depth is None else min(Lc, depth)
    del D

    # -- join with the sorted qrels, in docno order: the grades of each row's docnos
    keys = Ds + (cq * nd)[:, None]  # join keys (query, docno); (Ds may be a view of the codes: a new array)
    del Ds
    g = _join(keys.ravel(), cq, nd, jkey_s, jgrade_s)
    del keys
    # ... back to the run's order of each row, then to rank order (the padding's grades, whatever
    # they are, sort last there and never reach the output)
    g = g.reshape(nbc, Lc)
    if dorder is not None:
        back = np.empty_like(g)
        np.put_along_axis(back, dorder, g, axis=1)
        g = back
        del back, dorder
    if perm is None:
        g = g[:, :width] if width < Lc else g
    else:
        g = np.take_along_axis(g, perm[:, :width] if width < Lc else perm, axis=1)
    del perm
    g = g.ravel()
    ccut = lens_cut[sel]
    n_out = int(ccut.sum())
    if n_out != nbc * width:
        g = g.reshape(nbc, width)[np.arange(width)[None, :] < ccut[:, None]]

    # -- into the output, in evaluated-query order
    cp = qpos[sel]
    start = int(offsets[cp[0]])
    if nbc == 1 or bool(np.all(np.diff(cp) == 1)):  # queries in order (the usual case): one slice
        grades[start:start + n_out] = g
    else:
        grades[np.repeat(offsets[cp] - (np.cumsum(ccut) - ccut), ccut) + np.arange(n_out)] = g


def _doubles_of(rows_t, cl, Lc, rows, score) -> np.ndarray:
    """The negated scores as doubles of the padded rows ``rows_t`` of a chunk (``cl``: the rows'
    lengths, ``Lc`` the padded width, ``rows`` the chunk's run rows, a slice or indices), NaN in the
    padding: the float64 counterpart of those rows of the float32 array ``_chunk`` sorts."""
    start = (np.cumsum(cl) - cl)[rows_t]  # first row of each, within the chunk
    n = cl[rows_t]
    col = np.arange(Lc)
    valid = col[None, :] < n[:, None]
    local = (start[:, None] + col[None, :])[valid]
    at = local + rows.start if isinstance(rows, slice) else rows[local]
    out = np.full((len(rows_t), Lc), np.nan)
    out[valid] = np.asarray(score[at], dtype=np.float64)
    np.negative(out, out=out)
    return out
