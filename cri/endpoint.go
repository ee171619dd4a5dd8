package cri

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultEndpoints are the sockets tried, in order, when Config.Endpoint is empty: the
// same list and order crictl uses on Linux.
var DefaultEndpoints = []string{
	"unix:///run/containerd/containerd.sock",
	"unix:///run/crio/crio.sock",
	"unix:///var/run/cri-dockerd.sock",
}

// ParseEndpoint returns the socket path of a CRI endpoint given as unix:///abs/path or
// as an absolute path. Other schemes (tcp, npipe) and relative paths are refused with
// ErrInvalidEndpoint.
func ParseEndpoint(endpoint string) (string, error) {
	path := endpoint
	if scheme, rest, ok := strings.Cut(endpoint, "://"); ok {
		if scheme != "unix" {
			return "", fmt.Errorf("%w %q: scheme %q is not supported, only unix", ErrInvalidEndpoint, endpoint, scheme)
		}
		path = rest
	}
	if path == "" || !filepath.IsAbs(path) {
		return "", fmt.Errorf("%w %q: want unix:///absolute/path or /absolute/path", ErrInvalidEndpoint, endpoint)
	}
	return filepath.Clean(path), nil
}

// DiscoverEndpoint returns the first of candidates (DefaultEndpoints when nil) whose
// socket exists, as a unix:// endpoint.
func DiscoverEndpoint(candidates []string) (string, error) {
	if candidates == nil {
		candidates = DefaultEndpoints
	}
	for _, c := range candidates {
		path, err := ParseEndpoint(c)
		if err != nil {
			return "", err
		}
		if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			return "unix://" + path, nil
		}
	}
	return "", fmt.Errorf("%w (tried %s)", ErrNoRuntime, strings.Join(candidates, ", "))
}
