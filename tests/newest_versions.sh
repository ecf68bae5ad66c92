#!/usr/bin/env bash
# The unit tier on the newest releases that pyproject.toml allows (a fresh .venv-newest, no
# constraints): prints which of the libraries traceview relies on are newer than the pinned ones
# (constraints/ci.txt) and which unit tests fail on them. Always exits 0 unless asked otherwise
# (--strict): it warns, the pinned suite decides. Its own test output goes to a log, so that the
# only test summary CI reads is the pinned suite's.
set -uo pipefail
cd "$(dirname "$0")/.."
strict=${1:-}
log=${TMPDIR:-/tmp}/traceview-newest-versions.log
say() { echo "newest versions: $*"; }
fail() { say "WARNING: $*"; [ "$strict" = --strict ] && exit 1; exit 0; }
python3 -m venv --clear .venv-newest || fail "no virtual environment could be made"
venv=.venv-newest/bin/python
if ! { $venv -m pip install --quiet --upgrade pip &&
       $venv -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[dev,tensorflow]"; } >"$log" 2>&1; then
    fail "the newest allowed releases do not install together (see $log)"
fi
changed=0
for name in msgspec polars pyarrow textual xprof rich numpy; do
    newest=$($venv -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    pinned=$(sed -n "s/^$name==//Ip" constraints/ci.txt)
    if [ "$newest" != "$pinned" ]; then
        say "$name $newest (pinned: ${pinned:-none})"
        changed=1
    fi
done
if [ $changed = 0 ]; then
    # (the pinned suite runs the unit tier on these very versions: a second run tells nothing)
    say "the libraries traceview relies on are at their pinned versions"
    exit 0
fi
if $venv -m pytest tests/unit -q -p no:cacheprovider >"$log" 2>&1; then
    say "the unit tier passes on them"
else
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/newest versions:   /' | head -40
    fail "unit tests fail on the newest allowed releases (log: $log); fix them or narrow pyproject.toml's ranges, then constraints/refresh.sh"
fi
