# The filewrite daemon as a small static image. Build context: the
# repository root (see .dockerignore). docker-compose.yml builds it.

# Build stage: the Go toolchain go.mod asks for, a static binary (no cgo,
# so it needs no libc at run time).
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git is not in the build context, so the binary cannot read its commit
# from VCS: pass it (docker-compose build --build-arg
# COMMIT=$(git rev-parse HEAD)); --version and filewrite_build_info show it.
ARG VERSION=""
ARG COMMIT=""
RUN CGO_ENABLED=0 go build -trimpath \
	-ldflags="-s -w -X github.com/filewrite/filewrite/service.buildVersion=${VERSION} -X github.com/filewrite/filewrite/service.buildCommit=${COMMIT}" \
	-o /out/filewrite . \
	&& mkdir -p /out/data

# Run stage: distroless static, no shell, running as the unprivileged
# "nonroot" user (uid 65532), which owns /data so that a fresh named volume
# mounted there is writable.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/filewrite /filewrite
COPY --from=build --chown=65532:65532 /out/data /data
VOLUME /data
# gRPC, then HTTP (REST gateway, /metrics, /debug/locks).
EXPOSE 50051 8080
# The image has no shell: the binary is its own probe (docs/operations.md).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
	CMD ["/filewrite", "probe", "--grpc-addr", "127.0.0.1:50051"]
ENTRYPOINT ["/filewrite"]
# Inside a container the daemon must listen on every interface. It refuses
# to do that without --auth-token-file (a mounted token file) or an
# explicit --insecure-listen: add one of them, as docker-compose.yml does.
CMD ["--root", "/data", "--grpc-addr", "0.0.0.0:50051", "--http-addr", "0.0.0.0:8080"]
