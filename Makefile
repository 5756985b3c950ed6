# Two entry points, both self-contained on a fresh machine with Python 3.11:
#   make demo   creates .venv, installs streameval with its report extra (matplotlib, tqdm), runs the batch
#               job on the bundled sample and writes the HTML report of its output (out/demo/report)
#   make test   creates .venv, installs streameval with its test and bench extras, fetches the engines
#               (make engines), runs the static checks (make check), the test suite, the engine tier,
#               benchmarks/run.py --quick (a smoke run of every benchmark) and the regression gate --check
#   make check  the static checks alone (.ci/checks.py: ruff, import-linter, mypy and vulture against their
#               baselines, module and function sizes; docs/checks.md), about 15 s
#   make engines      fetches the engines (Flink's jars, Prism, Kafka) and the dashboard's uPlot into ~/.cache/streameval
#   make test-engines the engine tier alone (tests/test_engines.py: Prism and a local Flink cluster)
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

# obp, the off-policy oracle of tests/test_ope_dr.py, without its dependencies: its pins want torch
# (about 700 MB) and older packages; the estimators it is checked against need numpy, scipy and
# scikit-learn only (the test stands a stub in for torch's type hints)
OBP := obp==0.4.1

# installing the test extras also compiles the numba code of ranx (an oracle) once: tests/warm_oracles.py
# (about 4 minutes of one core in a fresh environment, which the suite's ranx tests paid before)

.PHONY: demo check test test-engines test-kafka engines bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-report: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[report]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m pip install --quiet --no-deps $(OBP)
	$(BIN)/python -m tests.warm_oracles || echo "tests/warm_oracles.py failed (above): the suite compiles ranx's code itself"
	touch $@ $(VENV)/.installed $(VENV)/.installed-report

demo: $(VENV)/.installed-report
	$(BIN)/streameval batch \
	  --impressions 'data/sample/impressions/*.avro' \
	  --judgments 'data/sample/judgments/*.avro' \
	  --metrics ndcg@10,map,mrr@10,P@10,err@10 \
	  --slices campaign --slice-missing skip \
	  --output out/demo
	$(BIN)/streameval report out/demo --out out/demo/report
	@echo "report: $(CURDIR)/out/demo/report/report.html"

# the suite runs on TEST_WORKERS processes (pytest-xdist; most tests wait on Beam and subprocesses)
TEST_WORKERS ?= 2

# the static checks first (make check, ~15 s: docs/checks.md), then the suite; after the suite, a smoke
# run of every benchmark (small sizes; it checks each peer's numbers against
# streameval's before timing, and fails on a disagreement or a peer's changed API) so that it cannot rot,
# then the regression gate (benchmarks/run.py --check, ~2 minutes): evaluate(), trec-eval and the batch
# job against references measured in the same run (pytrec_eval); it fails when a ratio is worse than
# twice its target, or when an engine's numbers disagree with pytrec_eval's
# (make engines first: the README's Prism example runs in the suite; the engine tier after the suite)
test: $(VENV)/.installed-bench engines
	$(BIN)/python .ci/checks.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not engines" --durations=25
	$(BIN)/python -m pytest -q -m "engines and not kafka" tests/test_engines.py --durations=10
	$(BIN)/python benchmarks/run.py --quick
	$(BIN)/python -m compileall -q streameval  # as an installed package is (PYTHONDONTWRITEBYTECODE=1 leaves it to compile at each start)
	$(BIN)/python benchmarks/run.py --check

# ruff, import-linter's contracts, mypy and vulture against their baselines (.ci/baselines/), module and
# function sizes; .ci/checks.py --lower writes the baselines down when they went down (docs/checks.md)
check: $(VENV)/.installed-test
	$(BIN)/python .ci/checks.py

# the engines' parts (docs/deploy.md); a part that cannot be had is named with its reason, and the
# tests that need it skip (no Java or Go) or fail (the tool is there but the part is not)
engines: $(VENV)/.installed
	$(BIN)/streameval cluster fetch || echo "streameval cluster fetch: some parts could not be had (above)"

# the engine tier: one process (its clusters are session fixtures; the fault tests start their own), about
# 10-12 minutes on 2 cores (571 s before the Flink recovery and worker-pool fault tests)
test-engines: $(VENV)/.installed-test engines
	$(BIN)/python -m pytest -q -m "engines and not kafka" tests/test_engines.py --durations=10

# the Kafka broker and Beam's Java Kafka IO on Prism and Flink (about 6 minutes on 2 cores; not in make
# test: the engine tier's budget): docs/deploy.md, "Kafka"
test-kafka: $(VENV)/.installed-test engines
	$(BIN)/python -m pytest -q -m kafka tests/test_engines.py --durations=10

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/python -m pip install --quiet --no-deps $(OBP)
	$(BIN)/python -m tests.warm_oracles || echo "tests/warm_oracles.py failed (above): the suite compiles ranx's code itself"
	touch $@ $(VENV)/.installed $(VENV)/.installed-test $(VENV)/.installed-report

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run.py --repeat 3

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
