#!/usr/bin/env bash
# Runs every test of every Go module in the repository under the race
# detector and with the invariants build tag (internal/invariants: the
# store's runtime assertions and the deliberate breaks the power-loss tests
# must catch): the root module, then each module below it that has
# packages of its own (tools/ only pins code generators). Extra arguments
# go to every `go test`, e.g. `scripts/test.sh -count=1` or
# `scripts/test.sh -short`.
set -euo pipefail
cd "$(dirname "$0")/.."

modules=(.)
for mod in */go.mod; do
	dir="$(dirname "$mod")"
	[[ "$dir" == tools ]] && continue
	modules+=("$dir")
done

for dir in "${modules[@]}"; do
	printf '== go test -race -tags invariants ./... (module %s)\n' "$dir"
	(cd "$dir" && go test -race -tags invariants "$@" ./...)
done
