"""Compile ranx's numba code once, when the test environment is installed (``make``'s install step).

ranx 0.3.21 (an oracle of the suite, never our engine) compiles each of its numba functions the first
time it is called and keeps the machine code in ``__pycache__`` beside its sources (``cache=True``).
In a fresh environment the suite's first ranx calls paid that compilation: about 5 minutes of one core
(``tests/test_fusion.py``'s first norm 83-92 s, ``tests/test_vocabularies.py`` 50-66 s), inside the
suite's time. This script makes the same calls the tests make (the same methods, normalisations, measure
names and statistical tests, on the tests' own small collections, so the same types and compiled
specialisations), once, at install time; the tests then load the compiled code. It checks nothing:
what it computes is thrown away, and a test whose call it did not foresee compiles as before.

    python -m tests.warm_oracles      # a no-op (exit 0) when ranx is not installed
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    try:
        import ranx
    except ImportError:
        print("warm_oracles: ranx is not installed; nothing to compile")
        return 0
    import warnings

    import numpy as np
    from ranx.normalization import norm_switch

    warnings.simplefilter("ignore")  # numba's type-safety warnings on ranx's code: the tests see them

    from tests.test_fusion import _PARAMS, _condorcet_runs, _random_runs
    from tests.test_vocabularies import RANX, _collection

    started = time.perf_counter()
    runs = _random_runs()
    for norm in ["min-max", "min-max-inverted", "max", "sum", "zmuv", "rank", "borda", None]:
        for method, params in _PARAMS.items():
            ranx.fuse([ranx.Run(r) for r in runs], norm=norm, method=method, params=params)
    for norm in ["min-max", "min-max-inverted", None]:
        for method, params in (("condorcet", {}), ("w_condorcet", {"weights": [0.2, 0.45, 0.35]})):
            ranx.fuse([ranx.Run(r) for r in _condorcet_runs()], norm=norm, method=method, params=params)
    rng = np.random.default_rng(5)
    qrels = {q: {f"d{x}": int(rng.integers(1, 3)) for x in rng.choice(40, 10, replace=False)} for q in runs[0]}
    rq = ranx.Qrels(qrels)
    from ranx.fusion import probfuse_train, slidefuse_train

    for norm in ["min-max", "zmuv", None]:
        normed = [ranx.Run(r) if norm is None else norm_switch(norm)(ranx.Run(r)) for r in runs]
        probfuse_train(rq, normed, 4)
        slidefuse_train(rq, normed)
        for method in ("posfuse", "mapfuse", "segfuse", "bayesfuse"):
            params = ranx.optimize_fusion(rq, [ranx.Run(r) for r in runs], norm=norm, method=method)
            ranx.fuse([ranx.Run(r) for r in runs], norm=norm, method=method, params=params)
    coll_qrels, coll_run = _collection(seed=9, n_queries=30)
    cq, cr = ranx.Qrels(coll_qrels), ranx.Run(coll_run)
    for name in RANX:
        ranx.evaluate(cq, cr, name, return_mean=False)
    systems = [ranx.Run(r, name=f"s{i}") for i, r in enumerate(runs)]
    for test in ("student", "tukey", "fisher"):
        ranx.compare(rq, systems, ["ndcg@10", "map"], stat_test=test, max_p=0.01, n_permutations=100)
    print(f"warm_oracles: ranx's numba code compiled in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
