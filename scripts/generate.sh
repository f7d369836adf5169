#!/usr/bin/env bash
# Regenerates api/ from proto/ byte for byte with the pinned buf and
# protoc plugins (see scripts/tools.sh). Run it after editing a .proto and
# commit api/ with the change; CI fails when api/ is stale.
set -euo pipefail
cd "$(dirname "$0")/.."

bin="$(scripts/tools.sh)"
PATH="$bin:$PATH" buf generate
