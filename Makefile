# Two commands on a fresh clone with only python3: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# Bytecode and pytest's rewritten test modules are cached (__pycache__/, ignored by git)
# even where the environment turns caching off: each test worker otherwise compiles and
# rewrites every module again (docs/performance.md, "The figures behind code choices").
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run demo test test-fast lint docs clean bench bench-check audit chaos postgres screenshots chromium promtool sim bench-subscriber

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	$(BIN)/receiver serve

# The whole chain for a minute on free loopback ports: a fake upstream service, a receiver
# registered there with enrichment, a Slack/email stand-in, a Slack app message updated in
# place by an ack (a Slack Web API stand-in), a hovering score with and without `flap`;
# a summary at the end. Stops by itself and leaves nothing running. DEMO_ARGS="--seconds 20"
# for a shorter run; DEMO_PORT=4000 (or DEMO_ARGS="--port 4000") puts the receiver on that
# port, to open its admin page and API while it runs.
demo: $(VENV)/.installed
	$(BIN)/python -m receiver.simulator.demo $(if $(DEMO_PORT),--port $(DEMO_PORT)) $(DEMO_ARGS)

# Six workers on 2 cores, each taking the next test when it is free: most tests wait on
# servers and clocks, not on the CPU. A file whose tests share a module fixture (the browser
# tests' one server) is one group that stays in one worker (tests/conftest.py marks it).
PYTEST_ARGS ?= -n 6 --dist loadgroup

# The collection first, once: it writes the bytecode of the rewritten test modules and of
# the receiver, which each of the six workers would otherwise make again on a fresh clone
# (docs/performance.md, the suite's time).
test: $(VENV)/.installed-dev postgres chromium promtool
	-@$(BIN)/python -m pytest --collect-only -q -p no:randomly >/dev/null
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests that start no server (the harness refuses to start one for a test not marked
# e2e): units, stores, rules, CLI parsing. PostgreSQL's store tests still run.
test-fast: $(VENV)/.installed-dev postgres
	$(BIN)/python -m pytest -m "not e2e" $(PYTEST_ARGS)

# The store tests run on SQLite and on a throwaway PostgreSQL that the tests start
# themselves (initdb, a free port), some also through a throwaway PgBouncer in transaction
# mode in front of it. Where either is missing, install it when apt can; otherwise those
# tests are skipped with one loud line (and fail under CI=true).
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; } \
	  || echo "*** PostgreSQL server not found and not installable here: its tests are skipped ***"
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null; } \
	  || echo "*** PgBouncer not found and not installable here: its tests are skipped ***"

# /metrics and deploy/prometheus-rules.yaml are checked by promtool (Debian's prometheus
# package, without its recommends). Where it is missing, install it when apt can; otherwise
# those tests are skipped with one loud line (and fail under CI=true).
promtool:
	@command -v promtool >/dev/null \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq \
	       && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
	  || echo "*** promtool not found and not installable here: its tests are skipped ***"

# The admin page's browser tests drive Debian's Chromium through Playwright (not Playwright's
# own browser download). Where it is missing, install it when apt can; otherwise those tests
# are skipped with one loud line (and fail under CI=true).
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "*** Chromium not found and not installable here: the admin browser tests are skipped ***"

# The deterministic simulation (tests/sim, docs/testing.md): random rules files and streams
# through the real pipeline on a virtual clock, with crashes, the invariants checked after
# every step. SEEDS=100000 for a soak; SEED=N replays one seed and writes its minimized case
# to sim-failures/. Its last line is `sim: N seeds, K violations`. `make test` runs 40 seeds,
# .ci/run all 300.
# PG=1: 30 seeds (SEEDS=N more), each also on a throwaway PostgreSQL it starts and stops.
SEEDS ?= $(if $(PG),30,300)
sim: $(VENV)/.installed-dev $(if $(PG),postgres)
	$(BIN)/python -m tests.sim $(if $(SEED),--seed $(SEED),--seeds $(SEEDS)) $(if $(PG),--pg) $(SIM_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check receiver tests bench chaos
	$(BIN)/mypy
	$(BIN)/python .ci/subjects.py

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link or anchor, a
# page left out of the navigation, or docs/settings.yaml disagreeing with receiver/settings.py
# fails it; then .ci/linkcheck.py fails it on any internal link or image of the built pages
# that does not resolve (raw HTML in a page included). .ci/run calls it.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python .ci/linkcheck.py site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site

# Not part of `make test`: the receiver vs a ceiling and adnanh/webhook, writes bench/RESULTS.md.
# BENCH_ARGS="--soak 600" for the issue's ten minutes of memory; python -m bench.run --help for more.
bench: $(VENV)/.installed-dev
	command -v wrk >/dev/null || (apt-get update && apt-get install -y wrk webhook)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# A quick run of every stream shape (bench/streams.py, about 3 minutes) against the last
# committed bench/figures.json (its "streams" entry, written by the streams part of
# `make bench`); fails on a drop of more than 15% in the worst shape's ratio to the
# ceiling. Not part of `make test`: machines are noisy.
bench-check: $(VENV)/.installed-dev
	command -v wrk >/dev/null || (apt-get update && apt-get install -y wrk webhook)
	$(BIN)/python -m bench.check

# The other subscribers' delivery latency (p50, p99) before and while one subscriber
# answers 500 (bench/dead_subscriber.py, about a minute); writes its section of
# bench/RESULTS.md. Not part of `make test`.
bench-subscriber: $(VENV)/.installed-dev
	$(BIN)/python -m bench.dead_subscriber $(BENCH_ARGS)

# Known vulnerabilities in the installed dependencies (pip-audit); says plainly when the
# vulnerability database cannot be reached instead of passing silently. .ci/run calls it.
audit: $(VENV)/.installed-dev
	$(BIN)/python .ci/audit.py

# Not part of `make test`: kill -9 under load, notifier outage, slow sink, SIGTERM;
# writes docs/RELIABILITY-RESULTS.md. CHAOS_ARGS="--kills 20 --outage 5m" to change.
# REPLICAS=3: only the replica scenario (3 receivers on one throwaway PostgreSQL, kill -9
# of a random one, a crash of PostgreSQL); it rewrites only its section of the report.
chaos: $(VENV)/.installed-dev $(if $(REPLICAS),postgres)
	$(BIN)/python -m chaos.run $(if $(REPLICAS),--replicas $(REPLICAS)) $(CHAOS_ARGS)

# The admin page's pictures in docs/admin.md, taken by its browser tests (docs/screenshots/).
screenshots: $(VENV)/.installed-dev chromium
	SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/admin/test_admin_browser.py -k screenshots_of_every_page -p no:randomly
