module vgpu-dra.local/conformance

go 1.26.0

require (
	github.com/opencontainers/runtime-spec v1.3.0
	google.golang.org/grpc v1.82.1
	k8s.io/kubelet v0.37.1
	tags.cncf.io/container-device-interface v1.1.1
)
