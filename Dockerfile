# syntax=docker/dockerfile:1
#
# The streamlimit binary in a static, non-root image:
#
#   docker build -t streamlimit --build-arg VERSION=$(git describe --tags --always) .
#   docker run --rm streamlimit version
#
# compose.yaml builds it for the two-data-center stack. Without Docker, `make image` builds
# an equivalent image FROM scratch as a tarball (docs/operations.md, "The container image").

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that editing the source does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/streamlimit ./cmd/streamlimit

# distroless/static: CA certificates, tzdata and /etc/passwd, no shell; "nonroot" is uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/streamlimit /streamlimit
USER 65532:65532
ENTRYPOINT ["/streamlimit"]
