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
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/filewrite . \
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
ENTRYPOINT ["/filewrite"]
# Inside a container the daemon must listen on every interface. It refuses
# to do that without --auth-token-file (a mounted token file) or an
# explicit --insecure-listen: add one of them, as docker-compose.yml does.
CMD ["--root", "/data", "--grpc-addr", "0.0.0.0:50051", "--http-addr", "0.0.0.0:8080"]
