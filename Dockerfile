# The ckpt image: a static, non-root ckpt binary and the pure-Go storage
# plugins on an empty base (no shell, no package manager).
#
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg COMMIT=$(git rev-parse HEAD) --build-arg DATE=$(git show -s --format=%cI HEAD) \
#     -t REGISTRY/ckpt:TAG .
#
# The build command is deploy/build.sh, which e2e/image_test.go runs and
# checks (static binaries, stamped version). More in deploy/README.md.
ARG GO_IMAGE=golang:1.26
# The build stage runs on the builder's platform and cross-compiles to the
# target's (docker buildx build --platform linux/amd64,linux/arm64).
FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# What `ckpt version --json` reports as commit and date (.git is not in the
# build context: pass them, or the binary says "unknown").
ARG COMMIT=
ARG DATE=
ARG TARGETOS
ARG TARGETARCH
RUN GOOS=$TARGETOS GOARCH=$TARGETARCH ./deploy/build.sh /out "$VERSION" "$COMMIT" "$DATE"
# The run-time user (a fixed UID and GID: manifests set the same numbers)
# and a writable /tmp for drills when the root filesystem is read-only.
RUN mkdir -p /rootfs/etc /rootfs/tmp && chmod 1777 /rootfs/tmp \
 && echo 'ckpt:x:65532:65532:ckpt:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd \
 && echo 'ckpt:x:65532:' > /rootfs/etc/group

FROM scratch
COPY --from=build /rootfs/ /
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/ckpt /usr/local/bin/ckpt
COPY --from=build /out/plugins/ /usr/lib/ckpt/plugins/
ENV PATH=/usr/local/bin CKPT_PLUGIN_DIR=/usr/lib/ckpt/plugins
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ckpt"]
CMD ["--help"]
