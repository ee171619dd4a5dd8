// Package e2e is a module that exists only to build upstream's end-to-end test binary
// (e2e.test, from k8s.io/kubernetes/test/e2e) and the agnhost test image at the
// Kubernetes version nodekit pins, without touching upstream/go.sum, which is the cache
// key of the peer binaries. hack/build-e2e.sh builds from here; its replace lines come
// from upstream/gen-replace.sh like every other module under upstream/.
package e2e
