// Package containerd pins containerd 2.x for hack/build-containerd.sh, which builds
// containerd, containerd-shim-runc-v2 and ctr from the Go module proxy at the version this
// module requires. The machines nodekit runs on ship Debian's containerd 1.6, which lacks
// what newer kubelet features need from the runtime (image volumes: CRI image mounts came
// in containerd 2.1). Nothing imports this package; the go.mod tool lines are the point.
package containerd
