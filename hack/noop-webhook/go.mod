module vgpu-dra.local/noop-webhook

go 1.26.0
