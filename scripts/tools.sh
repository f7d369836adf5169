#!/usr/bin/env bash
# Installs the pinned code-generation tools into .tools/bin (git-ignored) and
# prints that directory. buf comes from `go install` at a fixed version: its
# module graph needs a newer google.golang.org/protobuf than protoc-gen-go
# may have, so it cannot share tools/go.mod. The protoc plugins are pinned
# in tools/go.mod, because their versions decide the bytes of api/.
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=1.75.0
bin="$PWD/.tools/bin"
mkdir -p "$bin"

if [[ "$("$bin/buf" --version 2>/dev/null || true)" != "$BUF_VERSION" ]]; then
	GOBIN="$bin" go install "github.com/bufbuild/buf/cmd/buf@v$BUF_VERSION" >&2
fi
(cd tools && GOBIN="$bin" go install tool) >&2

echo "$bin"
